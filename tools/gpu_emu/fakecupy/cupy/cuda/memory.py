_allocator = None


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(
            f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, limit set to: {limit:,} bytes)."  # noqa: E501 (CuPy's own wording)
        )


class MemoryPool:
    """CuPy's default pool: a limit and a count of bytes per device (the current one's)."""

    def __init__(self):
        self._limits = {}
        self._useds = {}

    @property
    def _dev(self):
        from . import runtime

        return runtime._current

    @property
    def _limit(self):
        return self._limits.get(self._dev, 0)

    @property
    def _used(self):
        return self._useds.get(self._dev, 0)

    @_used.setter
    def _used(self, v):
        self._useds[self._dev] = v

    def release(self, dev, n):
        self._useds[dev] = self._useds.get(dev, 0) - n

    def set_limit(self, size=None, fraction=None):
        self._limits[self._dev] = int(size or 0)

    def get_limit(self):
        return self._limit

    def used_bytes(self):
        return self._used

    def total_bytes(self):
        return self._used

    def free_all_blocks(self):
        pass

    def malloc(self, n):
        if self._limit and self._used + n > self._limit:
            raise OutOfMemoryError(n, self._used, self._limit)
        self._used += n
        return n


class PinnedMemoryPool:
    pass
