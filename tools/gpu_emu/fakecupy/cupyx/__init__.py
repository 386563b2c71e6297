import numpy as _np


def empty_pinned(shape, dtype=_np.float32):
    return _np.empty(shape, dtype)


def zeros_pinned(shape, dtype=_np.float32):
    return _np.zeros(shape, dtype)
