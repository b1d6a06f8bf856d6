"""gmsfs.gms_torch: GMS's torch helpers (gpu_memory_service.client.torch.allocator, .module
and .tensor) on gmsfs.gms.  Weights published by register_module_tensors carry GMS's
metadata (a JSON TensorMetadata per tensor, keyed by its qualified name), so an engine
that materializes with GMS's own materialize_module_from_gms reads them too.

Where GMS routes each PyTorch segment through its own allocation, gms_use_mem_pool uses
libgmsfs's C allocator (gmsfs.torch.allocator: slabs, no Python callback): a model is a
handful of allocations, and register_module_tensors finds each tensor in its slab.  On
the host backend tensors are CPU tensors over the shared memory (torch.frombuffer)."""
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import torch

import gmsfs.torch as gt
import gmsfs._torch_layout as _tl
from gmsfs.gms import GMSClientMemoryManager, GrantedLockType, RequestedLockType

logger = logging.getLogger(__name__)

# ---- tensors ----


def _device_of(manager: GMSClientMemoryManager, device_index: int) -> torch.device:
    c = manager._client._conn() if manager._client is not None else manager._asleep
    return torch.device("cuda", device_index) if c.backend == "cuda" else torch.device("cpu")


def _tensor_from_pointer(data_ptr: int, shape: List[int], stride: List[int], dtype: torch.dtype,
                         device_index: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """A tensor over memory at data_ptr, no copy (GMS's helper).  device: cuda:INDEX by
    default; cpu for the host backend."""
    device = device or torch.device("cuda", device_index)
    item = torch.empty((), dtype=dtype).element_size()
    span = (sum(s * (d - 1) for s, d in zip(stride, shape) if d > 0) + 1) if shape else 1
    raw = _tl._bytes_at(data_ptr, span * item, device)
    return raw.view(dtype).as_strided(list(shape), list(stride))


def _parse_dtype(text: str) -> torch.dtype:
    name = str(text).split(".", 1)[-1]
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError("Unknown dtype: %r" % text)
    return dt


@dataclass(frozen=True)
class TensorMetadata:
    """One tensor's entry, as GMS writes it: JSON of shape, dtype, stride, tensor_type."""
    shape: Tuple[int, ...]
    dtype: torch.dtype
    stride: Tuple[int, ...]
    tensor_type: str = "parameter"

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, tensor_type: str = "parameter") -> "TensorMetadata":
        return cls(tuple(tensor.shape), tensor.dtype, tuple(int(s) for s in tensor.stride()), tensor_type)

    @classmethod
    def from_bytes(cls, value: bytes) -> "TensorMetadata":
        obj = json.loads(value.decode())
        shape = tuple(int(x) for x in obj["shape"])
        stride = obj.get("stride")
        if stride is None:
            acc, out = 1, []
            for d in reversed(shape):
                out.append(acc)
                acc *= d
            stride = list(reversed(out))
        return cls(shape, _parse_dtype(obj["dtype"]), tuple(int(x) for x in stride),
                   obj.get("tensor_type", "parameter"))

    def to_bytes(self) -> bytes:
        return json.dumps({"shape": list(self.shape), "dtype": str(self.dtype), "stride": list(self.stride),
                           "tensor_type": self.tensor_type}, sort_keys=True).encode()


# ---- modules ----

@dataclass(frozen=True)
class GMSTensorSpec:
    """One tensor's entry of the store, as GMS's GMSTensorSpec: its key (the tensor's
    name), allocation id, offset and metadata."""
    key: str
    name: str
    allocation_id: str
    offset_bytes: int
    meta: TensorMetadata

    @classmethod
    def load_all(cls, gms_client_memory_manager: GMSClientMemoryManager) -> Dict[str, "GMSTensorSpec"]:
        """Every entry of the manager's store: name -> spec."""
        specs: Dict[str, GMSTensorSpec] = {}
        for key in gms_client_memory_manager.metadata_list():
            got = gms_client_memory_manager.metadata_get(key)
            if got is None:
                raise RuntimeError("Metadata key disappeared: %s" % key)
            allocation_id, offset_bytes, value = got
            specs[key] = cls(key, key, str(allocation_id), int(offset_bytes), TensorMetadata.from_bytes(value))
        return specs

    def materialize(self, gms_client_memory_manager: GMSClientMemoryManager, device_index: int) -> torch.Tensor:
        """A tensor over the store's memory at its place (mapped if it was not), no copy."""
        base = gms_client_memory_manager.create_mapping(allocation_id=self.allocation_id)
        return _tensor_from_pointer(int(base) + self.offset_bytes, list(self.meta.shape), list(self.meta.stride),
                                    self.meta.dtype, device_index,
                                    _device_of(gms_client_memory_manager, device_index))


def _iter_module_tensors(module: torch.nn.Module, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor, str]]:
    """(qualified name, tensor, parameter|buffer) of every parameter and buffer."""
    for name, p in module._parameters.items():
        if p is not None:
            yield prefix + name, p, "parameter"
    for name, b in module._buffers.items():
        if b is not None:
            yield prefix + name, b, "buffer"
    for name, sub in module._modules.items():
        if sub is not None:
            yield from _iter_module_tensors(sub, prefix + name + ".")


def _resolve_module_attr(root: torch.nn.Module, name: str) -> Tuple[torch.nn.Module, str]:
    parts = name.split(".")
    mod = root
    for p in parts[:-1]:
        mod = getattr(mod, p) if hasattr(mod, p) else mod[int(p) if p.isdigit() else p]
    return mod, parts[-1]


def register_module_tensors(manager: GMSClientMemoryManager, model: torch.nn.Module) -> None:
    """Every tensor of model that lies in the store's memory, as a metadata entry (GMS's
    format); a parameter that does not is an error."""
    c = manager._client_rpc._conn()
    maps = sorted(c.mappings, key=lambda m: m.ptr)
    for m in maps:  # the C allocator's slabs, known to the manager too
        if m.name not in manager._inverse_mapping:
            from gmsfs._gms_common import LocalMapping, _slot_of
            manager._track(LocalMapping(m.name, m.ptr, m.size, m.aligned, 1, m.tag, _slot_of(m.name)))
    for name, tensor, kind in _iter_module_tensors(model):
        ptr = tensor.data_ptr()
        hit = next((m for m in maps if m.ptr <= ptr < m.ptr + m.aligned), None)
        if hit is None:
            if kind == "parameter":
                raise RuntimeError("Tensor %r not found in any GMS allocation" % name)
            continue
        manager.metadata_put(name, hit.name, ptr - hit.ptr, TensorMetadata.from_tensor(tensor, kind).to_bytes())


def materialize_module_from_gms(manager: GMSClientMemoryManager, model: torch.nn.Module, *, device_index: int) -> None:
    """model's tensors as views of the store (parameters shared, buffers copied: they may
    change), as GMS's."""
    device = _device_of(manager, device_index)
    for key in manager.metadata_list():
        alloc, offset, value = manager.metadata_get(key)
        meta = TensorMetadata.from_bytes(value)
        base = manager.create_mapping(allocation_id=alloc)
        t = _tensor_from_pointer(base + offset, list(meta.shape), list(meta.stride), meta.dtype, device_index, device)
        mod, attr = _resolve_module_attr(model, key)
        if meta.tensor_type != "parameter":
            if attr in getattr(mod, "_buffers", {}):
                mod._buffers[attr] = t.detach().clone()
            else:
                setattr(mod, attr, t.detach().clone())
            continue
        param = mod._parameters.get(attr) if hasattr(mod, "_parameters") else None
        if param is not None and (param.shape != t.shape or param.dtype != t.dtype):
            raise RuntimeError("Shape/dtype mismatch for %s: param=%s/%s, gms=%s/%s"
                               % (key, tuple(param.shape), param.dtype, tuple(t.shape), t.dtype))
        mod._parameters[attr] = torch.nn.Parameter(t, requires_grad=False)


# ---- the allocator registry ----

_managers: Dict[str, Tuple[GMSClientMemoryManager, str, int]] = {}


def get_or_create_gms_client_memory_manager(socket_path: str, device: int, mode: RequestedLockType, *,
                                            tag: str = "weights",
                                            timeout_ms: Optional[int] = None) -> GMSClientMemoryManager:
    """The process's manager for tag, connected in mode (one per tag, as GMS's)."""
    mode = RequestedLockType(mode)
    got = _managers.get(tag)
    if got is not None:
        manager, path, dev = got
        if (path, dev) != (socket_path, device):
            raise RuntimeError("GMS allocator tag=%s was initialized for %s on device %d, not %s on device %d"
                               % (tag, path, dev, socket_path, device))
        current = manager.granted_lock_type
        if mode == RequestedLockType.RW and current != GrantedLockType.RW:
            raise RuntimeError("Cannot get RW allocator for tag %s: existing is in %s mode" % (tag, current))
        if mode == RequestedLockType.RO and current != GrantedLockType.RO:
            raise RuntimeError("Cannot get RO allocator for tag %s: existing is in %s mode" % (tag, current))
        return manager
    manager = GMSClientMemoryManager(socket_path, device=device, tag=tag)
    manager.connect(mode, timeout_ms=timeout_ms)
    _managers[tag] = (manager, socket_path, device)
    return manager


def get_gms_client_memory_manager(tag: str = "weights") -> Optional[GMSClientMemoryManager]:
    got = _managers.get(tag)
    return got[0] if got else None


def get_gms_client_memory_managers() -> Tuple[GMSClientMemoryManager, ...]:
    return tuple(m for m, _, _ in _managers.values())


def evict_gms_client_memory_manager(manager: GMSClientMemoryManager) -> None:
    for tag, (m, _, _) in list(_managers.items()):
        if m is manager:
            del _managers[tag]


@contextlib.contextmanager
def gms_use_mem_pool(tag: str, device=None):
    """CUDA allocations of this block in the store of tag's writer (libgmsfs's C
    allocator: slabs of the store, no copy at publish)."""
    got = _managers.get(tag)
    if got is None:
        raise RuntimeError("No GMS allocator initialized for tag=%s" % tag)
    manager = got[0]
    if manager.granted_lock_type != GrantedLockType.RW:
        raise RuntimeError("GMS allocator tag=%s does not have a mempool" % tag)
    with gt.allocator(manager._client_rpc._conn()):
        yield
