import numpy as _np

from . import compiler, memory, runtime  # noqa


class Device:
    def __init__(self, i=0):
        self.id = i

    def use(self):
        runtime._current = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

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
