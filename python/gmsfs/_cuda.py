"""The calling thread's CUDA context, for the Python package.

libgmsfs maps a GPU store's memory in the calling thread's current context (libgmsfs(3)).
A Python engine often connects before it has touched the GPU (its first CUDA call is
materialize, or it speaks GMS's client API, which makes no context of its own), and then
it has none.  So before a connect the package makes the primary context of the store's
GPU current in the thread, as the CUDA runtime does at a program's first call; PyTorch
uses that same context afterwards.  Nothing is done where libcuda cannot be loaded, where
the thread has a context already, or for a store on the host backend; a GPU this process
cannot see is left to connect, which says so."""
import ctypes
import os

from ._fields import read_fields

_cu = None  # libcuda once loaded and initialized; False where it cannot be


def _driver():
    global _cu
    if _cu is None:
        try:
            cu = ctypes.CDLL("libcuda.so.1")
            _cu = cu if cu.cuInit(0) == 0 else False
        except OSError:
            _cu = False
    return _cu


def _mount_device(store):
    """backend and uuid from the store's mount's device file (gmsfs(5))."""
    try:
        fields = read_fields(os.path.join(os.path.dirname(os.path.abspath(store)), "device"))
    except OSError:
        return None, None
    return fields.get("backend"), fields.get("uuid")


def _uuid(raw):
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def make_current(store):
    """The primary context of store's GPU, current in this thread if none is."""
    cu = _driver()
    if not cu:
        return
    ctx = ctypes.c_void_p()
    if cu.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
        return
    backend, uuid = _mount_device(store)
    if backend != "cuda" or not uuid:
        return
    n = ctypes.c_int()
    if cu.cuDeviceGetCount(ctypes.byref(n)):
        return
    for i in range(n.value):
        dev, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        if cu.cuDeviceGet(ctypes.byref(dev), i) or cu.cuDeviceGetUuid_v2(raw, dev) or _uuid(raw) != uuid:
            continue
        if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
            cu.cuCtxSetCurrent(ctx)
        return
