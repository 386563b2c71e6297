"""IQ1_M: the portable kernel, the T2 layout with its AVX2 and AVX-512 kernels, AVX-512 helpers."""
