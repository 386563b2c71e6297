"""Six 1 GiB buffers of one process read one by one (strata.cpu.bandwidth.read_bandwidth, all
threads): whether a VM's memory differs in speed between buffers, which would make whole
processes of the same benchmark differ."""

import numba
import numpy as np

from strata.cpu.bandwidth import read_bandwidth

nt = numba.config.NUMBA_NUM_THREADS
bufs = [np.ones(1 << 27, np.uint64) for _ in range(6)]
for i, b in enumerate(bufs):
    r = read_bandwidth([b], nt, repeats=5)
    print(
        f"buffer {i}: {r['gbps']:.1f} GB/s (plain {r['plain_gbps']:.1f}, "
        f"prefetching {r['prefetch_gbps']:.1f})"
    )
