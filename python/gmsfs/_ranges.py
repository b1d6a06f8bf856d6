"""Address ranges over a connection: Space (allocations at addresses of their own), Pages
(a KV cache that grows and shrinks) and PageAllocator (blocks over pages)."""
import ctypes
import errno as _errno

from ._errors import GmsfsError
from ._lib import lib as _c


class _Range:
    """What Space and Pages share: address space of a connection, freed once (free(), or
    leaving a with block; EINVAL a second time), gone with the connection."""

    _free_name = ""  # the libgmsfs call that frees it ("gmsfs_space_free": errors say "space free")

    def __init__(self, conn):
        self._conn, self._r, self.freed = conn, ctypes.c_void_p(), False

    def _range(self):
        self._conn._handle()  # EBADF once the connection is closed: its ranges went with it
        return self._r

    def free(self):
        """Unmap everything the range maps and give its memory and addresses back."""
        self._conn._check(getattr(_c, self._free_name)(self._range()), self._free_name[6:].replace("_", " "))
        self.freed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.freed and self._conn._g:
            self.free()


class Space(_Range):
    """Address ranges of their own over a connection's allocations (gmsfs_space_*): map(name)
    gives the allocation's memory at a new address, with the connection's access; writes
    through either address are seen at the other.  unmap_all and remap_all keep the
    addresses.  A context manager: leaving it frees the space."""

    _free_name = "gmsfs_space_free"

    def __init__(self, conn, span=None):
        super().__init__(conn)
        if span:
            conn._check(_c.gmsfs_space_new_range(conn._handle(), span, ctypes.byref(self._r)), "space")
        else:
            conn._check(_c.gmsfs_space_new(conn._handle(), ctypes.byref(self._r)), "space")

    def map(self, name):
        """The address of allocation name (imported by the connection) in this space; the
        same address each time."""
        ptr = ctypes.c_void_p()
        self._conn._check(_c.gmsfs_space_map(self._range(), name.encode(), ctypes.byref(ptr)), "space map")
        return ptr.value


class Pages(_Range):
    """A KV cache's memory that grows and shrinks with its load (gmsfs_pages_*, libgmsfs(3)
    PAGES): span bytes of address space set aside at once, filled page by page with device
    memory from the GPU's budget (each page read-write at base + index * page_size) and
    emptied again.  The connection must hold the writer session (mode "rw"); its store's
    user.gms.quota, user.gms.min and user.gms.priority say how far it may grow, what is kept
    for it, and who gives pages back when the budget is short.  Pages within the minimum
    are made at once and stay in this process when unmapped, to map again with no request.
    A context manager: leaving it frees the range.

    Kept (libgmsfs(3) KEPT): keep() commits the pages and the engine's records while it goes
    on writing, so that its death keeps them; Pages.adopt() in the next writer maps them at
    the same indices (adopted: how many), records() says what each holds."""

    _free_name = "gmsfs_pages_free"

    def __init__(self, conn, span, page_size=0, adopt=False):
        super().__init__(conn)
        n = ctypes.c_uint64()
        if adopt:
            conn._check(_c.gmsfs_pages_adopt(conn._handle(), span, page_size, ctypes.byref(self._r), ctypes.byref(n)),
                        "pages adopt")
        else:
            conn._check(_c.gmsfs_pages_reserve(conn._handle(), span, page_size, ctypes.byref(self._r)), "pages reserve")
        self.adopted = n.value
        self.stale = None  # adopt(stale="mark"): why the adopted pages' records were cleared
        self.base = _c.gmsfs_pages_base(self._r)
        self.page_size = _c.gmsfs_pages_size(self._r)
        self.count = _c.gmsfs_pages_count(self._r)

    @staticmethod
    def _array(idx):
        idx = list(idx)
        return (ctypes.c_uint64 * max(len(idx), 1))(*idx), len(idx)

    def map(self, idx, timeout_ms=0):
        """Map the pages idx (an iterable of indices) in one request, all or nothing; where
        the budget is short, wait up to timeout_ms for lower-priority stores to give back."""
        arr, n = self._array(idx)
        self._conn._check(_c.gmsfs_pages_map(self._range(), arr, n, int(timeout_ms)), "pages map (%d)" % n)

    def unmap(self, idx):
        """Unmap the pages idx (after the GPU work this thread's context queued: a kernel
        still writing a page would fault); those within the store's minimum stay held here,
        the rest go back to the daemon in one request."""
        arr, n = self._array(idx)
        self._conn._check(_c.gmsfs_pages_unmap(self._range(), arr, n), "pages unmap (%d)" % n)

    @property
    def mapped(self):
        """Pages mapped now."""
        return _c.gmsfs_pages_mapped(self._range())

    def reclaim(self):
        """Bytes the daemon asks this store to give back now (0: none); held pages past a
        lowered minimum go back as it reads it."""
        n = ctypes.c_uint64()
        self._conn._check(_c.gmsfs_pages_reclaim(self._range(), ctypes.byref(n)), "pages reclaim")
        return n.value

    @classmethod
    def adopt(cls, conn, span, page_size=0, weights=None, stale="refuse"):
        """The pages of the first range the store kept (that this connection holds none
        of), at the same indices of a new range of span bytes, bytes and records as the dead
        writer left them; an empty range where none was kept.  The session is kept from now.

        weights: the Connection of the weights this engine serves (a reader's).  The pages
        were kept with the weights that computed them (tie()): where those were other
        weights, or nothing says, stale="refuse" raises GmsfsError (ESTALE, or ENOENT),
        nothing adopted; stale="mark" adopts them with every record cleared (kept so: no
        page is trusted, the engine refills them), and .stale says why.  Either way the
        pages are tied to weights from then on."""
        if stale not in ("refuse", "mark"):
            raise ValueError("stale: 'refuse' or 'mark', not %r" % (stale,))
        why = None
        if weights is not None:
            e = _c.gmsfs_pages_tied(conn._handle(), weights._handle())
            if e and (stale == "refuse" or e not in (-_errno.ESTALE, -_errno.ENOENT)):
                conn._check(e, "pages adopt")
            why = _c.gmsfs_errmsg(conn._handle()).decode(errors="replace") if e else None
        pages = cls(conn, span, page_size, adopt=True)
        pages.stale = why
        if weights is not None:
            pages.tie(weights)
        if why and pages.adopted:
            pages.keep({i: b"" for i in pages.records()})  # nothing they say is trusted
        return pages

    def tie(self, weights):
        """The pages are computed with the weights weights (a reader's Connection of the
        weights store) holds: each keep records them (the store, its commit, its version
        name, its content hash), so that an adopter serving other weights is refused them.
        None: untied.  Call it again after flipping or remapping to other weights: every
        page mapped then was computed with the old ones, and is returned (the indices of
        this range's; the others' in their .old): old until a keep gives it a record or it
        is unmapped, its record cleared at the next keep (no adopter trusts it)."""
        self._conn._check(_c.gmsfs_pages_tie(self._conn._handle(), weights._handle() if weights is not None
                                             else None), "pages tie")
        return self.old

    @property
    def old(self):
        """Indices of this range's pages computed with the weights tied before the last
        tie() to other weights (see tie)."""
        n = ctypes.c_size_t()
        r = self._range()
        self._conn._check(_c.gmsfs_pages_old(r, None, 0, ctypes.byref(n)), "pages old")
        arr = (ctypes.c_uint64 * max(n.value, 1))()
        self._conn._check(_c.gmsfs_pages_old(r, arr, n.value, ctypes.byref(n)), "pages old")
        return list(arr[:n.value])

    @property
    def name(self):
        """The range's name: its entries are meta/pages/NAME/INDEX."""
        return _c.gmsfs_pages_name(self._range()).decode()

    def keep(self, records=None):
        """Commit the layout while the engine goes on writing (GMS's commit_layout): every
        mapped page at its index, records ({index: bytes}, b"" clears one: its bytes are not
        to be trusted) replacing those of their pages.  Clear a page's record before writing
        it again."""
        items = [(i, bytes(d)) for i, d in (records or {}).items()]  # alive through the call
        arr = (_PageRecord * max(len(items), 1))()
        for k, (i, data) in enumerate(items):
            arr[k].idx, arr[k].len = i, len(data)
            arr[k].data = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p) if data else None
        self._conn._check(_c.gmsfs_pages_keep(self._range(), ctypes.cast(arr, ctypes.c_void_p), len(items)),
                          "pages keep (%d records)" % len(items))

    def records(self):
        """{index: record bytes, or None where the page has none} for every mapped page."""
        out, data, n = {}, ctypes.c_void_p(), ctypes.c_size_t()
        r = self._range()
        for i in range(self.count):
            e = _c.gmsfs_pages_record(r, i, ctypes.byref(data), ctypes.byref(n))
            if e == -_errno.ENOENT:
                continue
            self._conn._check(e, "pages record")
            out[i] = ctypes.string_at(data.value, n.value) if n.value else None
        return out

    def ptr(self, index):
        """The address of page index."""
        if not 0 <= index < self.count:
            raise IndexError(index)
        return self.base + index * self.page_size



class _PageRecord(ctypes.Structure):
    _fields_ = [("idx", ctypes.c_uint64), ("data", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class PageAllocator:
    """Blocks of a KV cache over Pages, for an engine's block manager: alloc(n) gives n free
    block numbers, mapping the pages they fall in first; free(blocks) gives blocks back and
    unmaps pages that hold no block any more (shrink=True) or keeps them for the next alloc.
    give_back() unmaps free pages until the daemon's reclaim is met, for an engine to call
    from its loop.  Over adopted pages (Pages.adopt) their blocks start free: claim() takes
    back those the engine's index (the pages' records) says hold its sequences."""

    def __init__(self, pages, block_bytes, timeout_ms=1000):
        if block_bytes <= 0 or pages.page_size % block_bytes:
            raise ValueError("block_bytes must divide the page size (%d)" % pages.page_size)
        self.pages, self.timeout_ms = pages, timeout_ms
        self.per_page = pages.page_size // block_bytes
        self.used = [0] * pages.count          # blocks in use, per page
        self.mapped = [False] * pages.count
        self.free_blocks = []                  # free blocks of mapped pages
        self.in_use = set()
        for p in (pages.records() if pages.mapped else ()):  # adopted: mapped, every block free
            self.mapped[p] = True
            self.free_blocks.extend(range(p * self.per_page, (p + 1) * self.per_page))

    def claim(self, blocks):
        """Take the blocks (free ones of mapped pages: an adopted cache's, by its records)
        into use, all or none (ValueError naming one that is not free)."""
        blocks = list(blocks)
        free = set(self.free_blocks)
        for b in blocks:
            if b not in free:
                raise ValueError("block %d is not a free block of a mapped page" % b)
            free.discard(b)
        self.free_blocks = [b for b in self.free_blocks if b in free]
        for b in blocks:
            self.used[b // self.per_page] += 1
            self.in_use.add(b)

    def alloc(self, n):
        """n block numbers; OSError(ENOSPC) when no page can be had (nothing changes then)."""
        need = max(0, n - len(self.free_blocks))
        pages = []
        if need:
            empty = [i for i, m in enumerate(self.mapped) if not m]
            want = -(-need // self.per_page)
            if want > len(empty):
                raise GmsfsError(_errno.ENOSPC, "pages: the range is full (%d pages)" % self.pages.count)
            pages = empty[:want]
            self.pages.map(pages, self.timeout_ms)
            for p in pages:
                self.mapped[p] = True
                self.free_blocks.extend(range(p * self.per_page, (p + 1) * self.per_page))
        got = [self.free_blocks.pop() for _ in range(n)]
        for b in got:
            self.used[b // self.per_page] += 1
            self.in_use.add(b)
        return got

    def free(self, blocks, shrink=True):
        emptied = []
        for b in blocks:
            self.in_use.remove(b)
            p = b // self.per_page
            self.used[p] -= 1
            self.free_blocks.append(b)
            if not self.used[p]:
                emptied.append(p)
        if shrink and emptied:
            self._unmap(emptied)

    def _unmap(self, pages):
        gone = set()
        for p in pages:
            gone.update(range(p * self.per_page, (p + 1) * self.per_page))
            self.mapped[p] = False
        self.free_blocks = [b for b in self.free_blocks if b not in gone]
        self.pages.unmap(pages)

    def give_back(self):
        """Unmap pages that hold no block, as many as the daemon asks for; returns the bytes
        given.  Pages in use stay: their blocks are the engine's to evict first."""
        want = self.pages.reclaim()
        idle = [p for p, m in enumerate(self.mapped) if m and not self.used[p]]
        take = idle[:-(-want // self.pages.page_size)] if want else []
        if take:
            self._unmap(take)
        return len(take) * self.pages.page_size
