"""gmsfs.torch's ground: how tensors lie in a store (include/gmsfs/torch.h: the prefix,
the tag, the alignment, the dtypes), where a module's tensors are, and bytes at an
address as a tensor.  gmsfs.torch re-exports it."""
import ctypes

import torch


# The layout of include/gmsfs/torch.h (gmsfs(5), "Tensors"); tests check these against it.
PREFIX = "torch/"
TAG = "torch"
ALIGN = 512
SLAB_BYTES = 1 << 30

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_ITEMSIZE = {d: torch.empty(0, dtype=d).element_size() for d in _DTYPES.values()}
_DTYPE_NUMBER = {d: i for i, d in enumerate(_DTYPES.values())}  # in a typed base's key


def _where(module, prefix=""):
    """{name: (dict, attribute, tensor, is_parameter, owner)} of every parameter and buffer
    of module, each module's parameters then its buffers, module by module in order; a
    module or tensor reached by two paths is there under both names (tied weights).
    materialize's one pass over a module of hundreds: the least Python per module (its
    __dict__ read once, a call per module rather than a stack) and per tensor."""
    out = {}

    def visit(pre, m):
        md = m.__dict__
        d = md["_parameters"]
        if d:
            for attr, t in d.items():
                if t is not None:
                    out[pre + attr] = (d, attr, t, True, m)
        d = md["_buffers"]
        if d:
            for attr, t in d.items():
                if t is not None:
                    out[pre + attr] = (d, attr, t, False, m)
        for n, c in md["_modules"].items():
            if c is not None:
                visit(pre + n + ".", c)
    visit(prefix, module)
    return out


def _tensors(module, prefix=""):
    """[(name, owner, attribute, tensor, is_parameter)] of _where."""
    return [(name, m, attr, t, p) for name, (_, attr, t, p, m) in _where(module, prefix).items()]


def _storage(t):
    """(pointer, bytes) of a tensor's storage."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


def _private(private):
    if callable(private):
        return private
    names = set(private or ())
    return lambda name: name in names


class _CudaBytes:
    """n bytes of device memory at ptr, for torch.as_tensor (no copy)."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _bytes_at(ptr, n, device):
    """A uint8 tensor over n bytes at ptr, on device, sharing the memory."""
    if device.type == "cuda":
        return torch.as_tensor(_CudaBytes(ptr, n), device=device)
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=torch.uint8)


def _device(conn):
    if conn.backend == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
