"""gmsfs.torch's allocators: PyTorch's CUDA allocations carved out of a store's slabs
(allocator), and CUDA graphs of many shapes in one space (GraphPool).  gmsfs.torch
re-exports them."""
import contextlib
import errno

import torch

from gmsfs import Connection, GmsfsError, _lib, connect
from gmsfs._lib import lib as _c


# ---- the allocator ----

_allocator = None
_pools = []  # PyTorch keeps a pool's segments until the pool goes: keep them as long as we live


@contextlib.contextmanager
def allocator(conn, slab_bytes=0):
    """Within this block, CUDA allocations of this thread are carved out of slabs of the
    store (a writer's connection): parameters made here are published with no copy."""
    global _allocator
    if conn.backend != "cuda":
        raise GmsfsError(errno.EINVAL, "allocator: the store is in host memory (publish copies instead)")
    if _allocator is None:
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "gmsfs_torch_alloc", "gmsfs_torch_free")
    e = _c.gmsfs_torch_use(conn._handle(), slab_bytes)
    if e:
        conn._check(e, "allocator")
    pool = torch.cuda.MemPool(_allocator.allocator())
    _pools.append(pool)
    try:
        with torch.cuda.use_mem_pool(pool):
            yield pool
    finally:
        _c.gmsfs_torch_use(None, 0)


class GraphPool:
    """CUDA graphs of many shapes in the memory of the largest (xLLM's multi-shape graph
    memory, on gmsfs's virtual spaces).  An engine replays one graph per step, so graphs
    captured for different batch sizes may share memory: each capture gets an address
    range of its own over the same chunks of store (a writer's connection, or a store
    path: connected RW, kept uncommitted as scratch memory), so N captures cost the
    largest one, captured in any order, and each graph keeps its addresses for its life.

        pool = gmsfs.torch.GraphPool("/run/gmsfs/GPU-.../graphs")
        for bs in (1, 2, 4, 8):
            with pool.capture(graphs[bs]):        # torch.cuda.graph(graphs[bs], pool=...)
                out[bs] = model(static_in[bs])
        graphs[8].replay()                        # out[8] holds until another graph runs

    A graph's outputs are valid until another graph of the pool is replayed (they share
    memory): read or copy them first.  Run the model once before capturing (as vLLM and
    SGLang do), so that lazily made buffers come from PyTorch's own memory, not from one
    capture's.  One pool per process (gmsfs_graph_*: the allocator has no context)."""

    def __init__(self, store, chunk_bytes=64 << 20, span_bytes=0):
        self.conn = store if isinstance(store, Connection) else connect(store, "rw")
        self.conn._check(_c.gmsfs_graph_use(self.conn._handle(), chunk_bytes, span_bytes), "graph pool")
        self._alloc = None
        self.pools = []  # one MemPool per capture, kept with its graph

    @contextlib.contextmanager
    def capture(self, graph, **kwargs):
        """torch.cuda.graph(graph, pool=...) with this capture's memory in a space of its own."""
        if self._alloc is None:
            self._alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "gmsfs_graph_alloc",
                                                                    "gmsfs_graph_free")
        self.conn._check(_c.gmsfs_graph_begin(), "graph pool: begin")
        pool = torch.cuda.MemPool(self._alloc.allocator())
        self.pools.append(pool)
        with torch.cuda.graph(graph, pool=pool.id, **kwargs):
            yield graph

    @property
    def nbytes(self):
        """The memory the pool holds: the largest capture's, in chunks."""
        return int(_c.gmsfs_graph_bytes())

    def close(self):
        _c.gmsfs_graph_use(None, 0, 0)
        self.conn.close()
