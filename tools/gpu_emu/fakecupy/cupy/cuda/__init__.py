import numpy as _np

from . import compiler, memory, runtime  # noqa


class Device:
    """A device ordinal (EMU_NDEV of them); as a context it makes itself current and restores
    the previous one on exit, as CuPy's does."""

    def __init__(self, i=None):
        self.id = runtime._current if i is None else int(i)
        self._prev = []

    def use(self):
        if not 0 <= self.id < runtime.getDeviceCount():
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")
        runtime._current = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        self._prev.append(runtime._current)
        self.use()
        return self

    def __exit__(self, *a):
        runtime._current = self._prev.pop()

    @property
    def attributes(self):
        return {"WarpSize": runtime.WARP, "MultiProcessorCount": 4}

    @property
    def compute_capability(self):
        return "90"


class Stream:
    null = None

    def __init__(self, non_blocking=False, null=False):
        pass

    def synchronize(self):
        pass

    def record(self, event=None):
        ev = event if event is not None else Event()
        ev.record(self)
        return ev

    def wait_event(self, event):
        pass  # everything is synchronous

    def begin_capture(self):
        raise RuntimeError("no graphs in the emulator")

    def end_capture(self):
        raise RuntimeError("no capture")

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def use(self):
        return self

    @property
    def ptr(self):
        return 0


Stream.null = Stream()


def get_current_stream():
    return Stream.null


class Event:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    @property
    def done(self):
        return True  # everything is synchronous


def get_elapsed_time(a, b):
    return 1.0


def set_allocator(fn=None):
    memory._allocator = fn


def alloc_pinned_memory(n):
    return _np.empty(n, _np.uint8)
