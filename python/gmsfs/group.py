"""gmsfs.Group: a model over N GPUs as one (gmsfs(5), NAMED VERSIONS, "Groups").

A group names one store per rank, on as many mounts: a text file of store paths, one a
line in rank order ('#' starts a comment), which an operator reads and an engine opens:

    # llama-70b, tensor parallel over 4 H200
    /run/gmsfs/gpu0/llama-70b
    /run/gmsfs/gpu1/llama-70b
    ...

Every rank serves version V or none does.  Each store has user.gms.versions 2, so that a
trainer's rank builds the next version beside the engines; the group's version is the
newest name committed on every rank, and an engine's rank flips to it only once it is (a
flip that cannot then fail, and fails before anything changed where it is not), so that
engines that agree on it through their own collectives flip in lockstep.  A trainer killed
after refitting some ranks leaves every engine on the version before; the next refit of
the same name completes it (the ranks that have it are skipped) and a refit of another
name is refused until it is.  A fresh engine's rank connects to the group's version, and
waits while its own store holds a name the group does not have yet."""
import errno
import os
import select
import time

from ._errors import GmsfsError
from ._store_files import committed_version, versions


def _connect(*args, **kw):
    """gmsfs.connect, whose module (and libgmsfs) loads at a group's first connection: a
    command that only reads the group's files (gmsfsctl group) starts without them."""
    from ._connection import connect
    return connect(*args, **kw)


class Group:
    def __init__(self, stores):
        self.stores = [os.path.abspath(str(s)) for s in stores]
        if not self.stores:
            raise ValueError("a group names one store per rank: none given")
        if len(set(self.stores)) != len(self.stores):
            raise ValueError("a group names each store once: %s" % self.stores)

    @classmethod
    def open(cls, path):
        """The group a file names (one store path a line, in rank order)."""
        with open(path) as f:
            stores = [line.split("#", 1)[0].strip() for line in f]
        stores = [s for s in stores if s]
        if not stores:
            raise ValueError("%s: no store named (one store path a line, in rank order)" % path)
        return cls(stores)

    def __len__(self):
        return len(self.stores)

    def __repr__(self):
        return "Group(%r)" % (self.stores,)

    def names(self):
        """Each rank's named commits kept, oldest first: [[(generation, name, state)], ...]."""
        return [versions(s) for s in self.stores]

    def committed(self, name):
        """The ranks whose store had a commit named name."""
        return _have(self.names(), name)

    def ready(self, name):
        """Was name committed on every rank?  Once it is, it stays so."""
        return len(self.committed(name)) == len(self.stores)

    def version(self):
        """The group's version: the newest name committed on every rank (newest by rank
        0's commits), or None."""
        same = self._same_last()
        return same if same is not None else _newest_common(self.names())

    def pending(self):
        """A name some ranks committed after the group's version and others not yet:
        (name, [ranks that have it]), or None."""
        return _pending(self.names())

    def status(self):
        """Per rank: (store, the last commit's name or None, its generation)."""
        out = []
        for s in self.stores:
            with open(os.path.join(s, "generation")) as f:
                out.append((s, committed_version(s), int(f.read())))
        return out

    def wait(self, name, timeout=None):
        """Wait until name is committed on every rank (timeout seconds; None: as long as it
        takes): GmsfsError ETIMEDOUT."""
        end = None if timeout is None else time.monotonic() + timeout
        with _Commits(self.stores) as commits:
            while not self.ready(name):
                if not commits.wait(end):
                    raise GmsfsError(errno.ETIMEDOUT, "group: version %s is committed on ranks %s of %d within %ss"
                                     % (name, self.committed(name), len(self.stores), timeout))

    # ---- a trainer's rank ----
    def refit(self, rank, source, version, timeout=None, prepared=None, **kw):
        """Rank rank's part of the group's next version: source into its store, the commit
        named version.  source: a callable given a data-only Connection of the store, which
        writes its bytes (imports what it writes), or what gmsfs.torch.refit takes (kw go
        to it).  A rank whose last commit is version is skipped (a refit killed on some
        ranks is completed by running it again): returns False then, True when it
        committed.  Refused, nothing written: GmsfsError EBUSY while the group has another
        name committed on some ranks only, ESTALE where the rank committed past version.
        prepared: what prepare() returned for this rank and version (its look at the ranks
        and everything before the copies done then): source is copied in and committed; the
        connection is closed either way."""
        store = self._store(rank)
        if prepared is None:
            if not self._may_refit(rank, version):
                return False
        elif prepared.store != store:
            raise ValueError("group: rank %d's refit was given %s's prepared connection" % (rank, prepared.store))
        try:
            if _writes_itself(source):
                with (prepared if prepared is not None else _connect(store, "data", timeout)) as c:
                    source(c)
                    c.commit(version=version, close=True)  # the lock given back in its request
            else:
                from .torch import refit
                refit(source, store if prepared is None else prepared, timeout=timeout, version=version,
                      _name_new=True, _closing=True, **kw).close()
        finally:
            if prepared is not None:
                prepared.close()  # refused or failed too: its session rolls back, the lock goes
        return True

    def prepare(self, rank, source, version, timeout=None, **kw):
        """What refit(rank, source, version) does before its copies, done ahead (while the
        trainer's step computes the weights): the look at every rank (refused as refit
        is), the rank's store taken for writing, and (source: what gmsfs.torch.refit takes)
        gmsfs.torch.refit_prepare's imports and destinations; source's values are not read.
        Returns the connection to pass to refit(..., prepared=), or None where the rank
        has version already (refit skips it).  The connection holds the rank's write lock
        until that refit, or its close (nothing written then)."""
        store = self._store(rank)
        if not self._may_refit(rank, version):
            return None
        if _writes_itself(source):
            return _connect(store, "data", timeout)
        from .torch import refit_prepare
        return refit_prepare(source, store, timeout=timeout, **kw)

    def _may_refit(self, rank, version):
        """One look at every rank (a file read each: 0.3-0.6 ms on a GPU host): False where
        rank's last commit is version already; refused where the group holds another
        pending name, or the rank committed past version."""
        names = self.names()
        mine = {n: state for _, n, state in names[rank]}
        if version in mine:
            if mine[version] == "serving":
                return False
            raise GmsfsError(errno.ESTALE, "group: rank %d committed past version %s (it serves %s)"
                             % (rank, version, committed_version(self.stores[rank])))
        p = _pending(names)
        if p and p[0] != version:
            raise GmsfsError(errno.EBUSY, "group: version %s is committed on ranks %s of %d only: refit it again to "
                             "complete it before %s" % (p[0], p[1], len(self.stores), version))
        return True

    # ---- an engine's rank ----
    def connect(self, rank, timeout=None):
        """A reader of rank's store at the group's version: waits (timeout seconds) while the
        group has none, or while this rank's store holds a name the others lack; then a
        read lock on exactly that commit (GmsfsError ETIMEDOUT, or ESTALE where it moved
        on meanwhile)."""
        store = self._store(rank)
        end = None if timeout is None else time.monotonic() + timeout
        with _Commits(self.stores) as commits:
            while True:
                v = self.version()
                if v is not None and committed_version(store) == v:
                    left = None if end is None else max(0.0, end - time.monotonic())
                    return _connect(store, "ro", left, version=v)
                if not commits.wait(end):
                    raise GmsfsError(errno.ETIMEDOUT, "group: rank %d: no version committed on every rank and "
                                     "served by its store within %ss (%s)" % (rank, timeout, self.status()))

    def flip(self, rank, conn, name=None):
        """Rank rank's engine (conn: its reader of the rank's store, or a module gmsfs.torch
        materialized) moves to name (None: the group's version), only if every rank has it
        committed: GmsfsError EAGAIN otherwise, nothing changed.  Returns how many
        allocations were mapped again."""
        name = self._on_every_rank(rank, name)
        return getattr(conn, "_gmsfs", conn).flip(version=name)

    def flip_ahead(self, rank, module, name=None, timeout=None):
        """flip() done ahead, for an engine's module (gmsfs.torch.materialize's): where every
        rank has name committed (None: the group's version), rank's commit of it mapped
        beside the one module serves (gmsfs.torch.flip_ahead): returns the Ahead, whose
        flip() then points the module's tensors at it and back() at the version before,
        neither of which can fail.  GmsfsError EAGAIN otherwise, nothing changed."""
        name = self._on_every_rank(rank, name)
        from .torch import flip_ahead
        return flip_ahead(module, name, timeout)

    def _on_every_rank(self, rank, name):
        """name (None: the group's version) where every rank has it committed, for rank's
        flip; GmsfsError EAGAIN otherwise, nothing changed."""
        self._store(rank)
        if name is None:
            name = self.version()  # committed on every rank, by what it is
            have = list(range(len(self.stores))) if name is not None else []
        else:
            have = self._committed_last(name)
        if len(have) < len(self.stores):
            raise GmsfsError(errno.EAGAIN, "group: version %s is committed on ranks %s of %d: not yet"
                             % (name, have, len(self.stores)))
        return name

    def _committed_last(self, name):
        """The ranks that had a commit named name, asked of each its last commit first
        (user.gms.version: one round trip, where STORE/versions is an open, a read and a
        close); its versions only where that is another name."""
        return [r for r, s in enumerate(self.stores)
                if _last_name(s) == name or any(n == name for _, n, _ in versions(s))]

    def _same_last(self):
        """The name every rank's last commit has, where they all have the same: then it is
        the newest name committed on every rank (the group's version).  None otherwise."""
        first = _last_name(self.stores[0])
        if first is None or any(_last_name(s) != first for s in self.stores[1:]):
            return None
        return first

    def _store(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < len(self.stores):
            raise ValueError("rank: 0 to %d, not %r" % (len(self.stores) - 1, rank))
        return self.stores[rank]


def _last_name(store):
    """The name of store's last commit (user.gms.version, "GENERATION NAME"), or None:
    none named, or nothing committed."""
    try:
        return os.getxattr(store, "user.gms.version").decode().split(" ", 1)[1]
    except (OSError, IndexError):
        return None


def _writes_itself(source):
    """A refit's source that writes its bytes itself (a callable), not what
    gmsfs.torch.refit takes (a dict, or a module: callable too)."""
    return callable(source) and not isinstance(source, dict) and not hasattr(source, "named_parameters")


def _have(names, name):
    """Of a look at every rank (Group.names), the ranks that had a commit named name."""
    return [r for r, v in enumerate(names) if any(n == name for _, n, _ in v)]


def _newest_common(names):
    common = set(n for _, n, _ in names[0])
    for v in names[1:]:
        common &= set(n for _, n, _ in v)
    newest = [n for _, n, _ in names[0] if n in common]
    return newest[-1] if newest else None


def _pending(names):
    done = _newest_common(names)
    for v in names:
        later = [n for _, n, _ in v]
        later = later[later.index(done) + 1:] if done in later else later
        for name in later:
            have = _have(names, name)
            if len(have) < len(names):
                return name, have
    return None


class _Commits:
    """The stores' commits, watched from here on (poll(2) on their version files, opened
    before the caller looks, so that a commit between its look and its wait wakes it)."""

    def __init__(self, stores):
        self.fds, self.poll = [], select.poll()
        try:
            for s in stores:
                fd = os.open(os.path.join(s, "version"), os.O_RDONLY)
                self.fds.append(fd)
                os.pread(fd, 128, 0)  # read: readable again at the next commit
                self.poll.register(fd, select.POLLIN)
        except BaseException:
            self.close()
            raise

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait(self, end):
        """Sleep until a store commits or end (monotonic; None: no end); False at the end."""
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return False
        for fd, _ in self.poll.poll(None if left is None else max(1, int(left * 1000))):
            os.pread(fd, 128, 0)
        return end is None or time.monotonic() < end
