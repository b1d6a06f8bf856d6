"""gpu_memory_service, as gmsfs gives it: on PYTHONPATH ($(python3 -m gmsfs.gms --path)),
an engine's `import gpu_memory_service.client...` reaches gmsfs.gms (see its docstring)."""
import gmsfs.gms as _gms

_gms.install()
from gmsfs.gms import GMSClientMemoryManager, RequestedLockType, GrantedLockType  # noqa: E402,F401
