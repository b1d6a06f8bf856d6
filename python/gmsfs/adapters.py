"""gmsfs.adapters: many small adapters of one base model (LoRA), each in a store of its
own, switched into one slot of a model with no copy.

    pool = gmsfs.adapters.AdapterPool("/run/gmsfs/GPU-.../lora", model, keep=8)
    pool.publish("sql", "adapters/sql")     # once: the adapter's folder (adapter_model.safetensors)
    pool.use("sql")                         # per request: the slot's tensors are the store's
    pool.prefetch("chat")                   # soon needed: back from the host tier now

A store per adapter, in the directory given (DIR/NAME).  use() maps the adapter's store
(a read lock; a store on the host tier comes back first) and points the slot's tensors
at its memory: switching between mapped adapters rebinds tensors and copies nothing.  At
most keep adapters stay mapped; the least recently used one beyond that sleeps
(gmsfs_unmap_all: its lock given back, its addresses kept), so that the daemon may move
it to the host tier when room is needed (give the adapters a low user.gms.priority and
they go before the models).  Waking one (gmsfs_remap_all) maps it at the same
addresses, so the tensors made for it the first time serve again: a warm switch is the
move back and the mapping, nothing per tensor.

The slot: the model's tensors whose name has the path segment slot (peft names a LoRA
adapter's weights "...q_proj.lora_A.SLOT.weight"); the adapter's tensor for each is the
name without it, as peft saves adapters ("...q_proj.lora_A.weight").  Names, shapes and
dtypes are checked before the slot is touched.
"""
import collections
import errno
import os

from . import GmsfsError, StaleLayoutError, connect, load, prefetch
from . import _torch_layout as _tl, _torch_materialize as _tm


def slot_name(name, slot):
    """The adapter file's name of the slot's tensor name (None: not the slot's)."""
    parts = name.split(".")
    at = [i for i in range(1, len(parts)) if parts[i] == slot and parts[i - 1].startswith("lora_")]
    if not at:
        return None
    return ".".join(parts[:at[0]] + parts[at[0] + 1:])


class AdapterPool:
    """Adapters in stores DIR/NAME, switched into the slot of model.  keep: how many stay
    mapped (hot); timeout: seconds use() waits for a store (None: as long as it takes)."""

    def __init__(self, directory, model, slot="default", keep=8, timeout=None):
        if keep < 1:
            raise ValueError("keep: at least 1, not %r" % (keep,))
        self.directory, self.model, self.slot, self.keep, self.timeout = os.fspath(directory), model, slot, keep, timeout
        self._items = [(key, owner, attr, t, is_param) for name, owner, attr, t, is_param in _tl._tensors(model)
                       for key in (slot_name(name, slot),) if key is not None]
        if not self._items:
            raise ValueError("the model has no tensors in a slot named %r (lora_*.%s.*)" % (slot, slot))
        self._known = {}  # name: [connection, its binds (_tm._bind)], mapped or asleep
        self._awake = collections.OrderedDict()  # the mapped ones, least recently used first
        self.active = None

    def store(self, name):
        if not name or "/" in name or name in (".", ".."):
            raise ValueError("an adapter's name is one path component, not %r" % (name,))
        return os.path.join(self.directory, name)

    def publish(self, name, path):
        """Load the adapter at path (a folder with adapter_model.safetensors, or the file)
        into a new store DIR/NAME and commit.  FileExistsError if it is there already."""
        if os.path.isdir(path):
            path = os.path.join(path, "adapter_model.safetensors")
        store = self.store(name)
        os.mkdir(store)
        try:
            with connect(store, "rw", self.timeout) as c:
                load(c, path, commit=True)  # and its content hash told
        except BaseException:
            os.rmdir(store)
            raise
        return store

    def _map(self, name):
        conn = connect(self.store(name), "ro", self.timeout)
        try:
            conn.import_all()
            # materialize's binding, the slot's names for the module's
            where = {key: (owner._parameters if p else owner._buffers, attr, t, p, owner)
                     for key, owner, attr, t, p in self._items}
            binds, made, bad, extra = _tm._bind(_tm._manifest(conn), where, _tl._device(conn), ())
            lacking, tied = _tm._leftover(where, made)
            missing = _tm._missing(lacking)
            if missing or extra:
                raise KeyError(_tm._names_differ("adapter (slot %r)" % self.slot, conn.store, missing, sorted(extra)))
            if bad:
                raise RuntimeError("adapter %s: %d tensor(s) do not match the slot %r, which is unchanged:\n  %s"
                                   % (name, len(bad), self.slot, "\n  ".join(bad)))
        except BaseException:
            conn.close()
            raise
        return [conn, binds + tied]

    def _wake(self, name, entry):
        try:
            entry[0].remap_all(self.timeout)
        except StaleLayoutError:  # published again since: tensors anew
            self.forget(name)
            entry = self._known[name] = self._map(name)
        return entry

    def use(self, name):
        """Make name the slot's adapter: mapped first if it is not (from the host tier if it
        is there), then every tensor of the slot rebound to it.  Returns the model."""
        entry = self._known.get(name)
        if entry is None:
            entry = self._known[name] = self._map(name)
        elif name not in self._awake:
            entry = self._wake(name, entry)
        self._awake[name] = True
        self._awake.move_to_end(name)
        _tm._assign(entry[1], 2)
        self.active = name
        while len(self._awake) > self.keep:
            self.release(next(iter(self._awake)))
        return self.model

    def release(self, name):
        """Let name sleep: unmapped, its lock given back (it may then move to the host
        tier), its addresses kept for use() to map it again.  The active adapter cannot
        be released: use another first."""
        if name == self.active:
            raise GmsfsError(errno.EBUSY, "adapter %s is the slot's: use another before releasing it" % name)
        if self._awake.pop(name, None):
            self._known[name][0].unmap_all()

    def forget(self, name):
        """Close name's connection: its addresses go too (use() maps it afresh)."""
        if name == self.active:
            self.active = None
        self._awake.pop(name, None)
        entry = self._known.pop(name, None)
        if entry is not None:
            entry[0].close()

    def prefetch(self, name):
        """Ask for name's store to come back from the host tier now, without waiting."""
        prefetch(self.store(name))

    @property
    def mapped(self):
        """The names mapped now, least recently used first."""
        return list(self._awake)

    def close(self):
        """Close every adapter's connection; the slot's tensors point at nothing after this."""
        self.active = None
        for name in list(self._known):
            self.forget(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
