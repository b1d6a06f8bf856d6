"""gmsfs.torch.flip_ahead: the next version mapped beside the one a module serves, so that
its flip is only the module's tensors pointed at it.  gmsfs.torch re-exports it.

A flip in place (gmsfs.torch.flip) maps the changed allocations again at the same
addresses: on a GPU that is the driver's unmap, map and access of every byte (5.8 GB: 1.5-
2.3 ms on an H200), with the engine stopped.  Ahead, that work is done while the engine
still serves (a second reader of the store, on the new commit, its memory at addresses
of its own, and the module's new views made and checked); the flip is then a setattr per
tensor (about 0.1 ms for a hundred), and going back as cheap, so that engine ranks that
agree through their own collectives flip in lockstep or not at all.  The addresses
change: for eager engines (a CUDA graph captured over the old ones needs the flip in
place)."""
from gmsfs import connect
from gmsfs._torch_layout import _device, _where
from gmsfs._torch_materialize import _assign, _bind, _leftover, _manifest, _names_differ


class Ahead:
    """A commit mapped beside the one module serves (flip_ahead's).  flip() points the
    module's tensors at it, back() at the version before again; close() lets go of the
    one the module does not serve (its mappings and read lock; a context manager's exit
    does too).  Only the module's tensors as they were when it was made ahead are
    pointed; materialize's buffers the store lacks stay the module's own."""

    def __init__(self, module, conn, binds):
        self.module, self.conn, self.old, self._binds = module, conn, module._gmsfs, binds
        self.flipped = False

    @property
    def version(self):
        return self.conn.version

    def flip(self):
        """The module's tensors become the new commit's views (no driver call, no round
        trip).  Returns how many tensors were pointed anew (0: done already)."""
        if self.flipped or self._binds is None:
            return 0
        _assign(self._binds, 2)
        self.module._gmsfs, self.flipped = self.conn, True
        return sum(len(b[2]) for b in self._binds)

    def back(self):
        """The module's tensors as they were before flip() (a rank that flipped where
        another could not)."""
        if self.flipped:
            _assign(self._binds, 3)
            self.module._gmsfs, self.flipped = self.old, False

    def close(self):
        """The version the module does not serve is let go: after flip() the old one (its
        mappings go once the work queued on them is done), otherwise the new one."""
        if self._binds is None:
            return
        (self.old if self.flipped else self.conn).close()
        self._binds = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def flip_ahead(module, version=None, timeout=None):
    """The store's commit version (None: the last) mapped at addresses of its own beside
    the one module serves (a module gmsfs.torch.materialize made), its views made and
    checked: returns an Ahead, whose flip() then only points the module's tensors.
    version: waits for that name (timeout seconds), refused as connect(version=) refuses
    it.  Where the module serves that commit already, an Ahead whose flip() does nothing.
    Refused, the module unchanged: KeyError (names) or RuntimeError (shapes, dtypes) where
    the commit's tensors differ from the module's."""
    now = module._gmsfs
    conn = connect(now.store, "ro", timeout, version=version)
    try:
        if conn.generation == now.generation:
            conn.close()
            return Ahead(module, now, None)
        conn._import_all()
        where = _where(module)
        binds, made, bad, extra = _bind(_manifest(conn), where, _device(conn), {})
        lacking, tied = _leftover(where, made)
        missing = [n for n, o, a, t, p in lacking if _served(t, now)]
        if missing or extra:
            raise KeyError(_names_differ("flip_ahead", conn.store, sorted(missing), sorted(extra)))
        if bad:
            raise RuntimeError("flip_ahead %s: %d tensor(s) do not match, the module is unchanged:\n  %s"
                               % (conn.store, len(bad), "\n  ".join(bad)))
        return Ahead(module, conn, binds + tied)
    except BaseException:
        conn.close()
        raise


def _served(t, conn):
    """Whether tensor t lies in memory conn maps (a tensor the last commit had, which the
    new one must have too)."""
    p = t.data_ptr()
    return any(m.ptr <= p < m.ptr + m.size for m in conn.mappings)
