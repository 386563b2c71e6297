import os

is_hip = False
WARP = int(os.environ.get("EMU_WARP", "32"))
_current = 0


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount():
    return int(os.environ.get("EMU_NDEV", "1"))


def getDevice():
    return _current


def getDeviceProperties(i):
    return {
        "name": b"Emulated GPU",
        "totalGlobalMem": 80 << 30,
        "major": 9,
        "minor": 0,
        "warpSize": WARP,
        "multiProcessorCount": 4,
        "gcnArchName": b"",
    }


def memGetInfo():
    return (70 << 30, 80 << 30)


def deviceCanAccessPeer(device, peer):
    return int(os.environ.get("EMU_PEER", "0"))  # 0: rows between devices go through the host


def deviceSynchronize():
    pass


memcpyHostToHost = 0
memcpyHostToDevice = 1
memcpyDeviceToHost = 2
memcpyDeviceToDevice = 3
memcpyDefault = 4


def memcpyAsync(dst, src, n, kind, stream):
    import ctypes

    ctypes.memmove(dst, src, n)
