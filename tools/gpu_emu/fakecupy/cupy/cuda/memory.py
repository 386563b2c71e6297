_allocator = None


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(
            f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, limit set to: {limit:,} bytes)."  # noqa: E501 (CuPy's own wording)
        )


class MemoryPool:
    def __init__(self):
        self._limit = 0
        self._used = 0

    def set_limit(self, size=None, fraction=None):
        self._limit = int(size or 0)

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
