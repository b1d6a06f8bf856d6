"""gmsfs.gms_failover: GMS's failover lock (gpu_memory_service.failover_lock), the election
of the one active engine among warm standbys, for engines that use GMS's failover and run
on gmsfs.  The lock is flock(2) on a file any engine can open (a file of a shared volume,
never one of a gmsfs mount: flock is the kernel's, and the mount's files are stores'); the
file also says who took it last.  flock goes with its holder's death, so a standby that
gets it knows the old engine is gone: its memory of gmsfs stores with it (the daemon
releases a dead process's locks; its mappings went with its address space).

    lock = FlockFailoverLock("/shared/engine.lock")
    await lock.acquire("engine-1")          # waits until the active engine is gone
    ...                                     # serve: take the store's lock, map, go
    await lock.release()"""
import abc
import asyncio
import fcntl
import os
import time
from typing import Optional

__all__ = ["FailoverLock", "FailoverLockError", "FlockFailoverLock"]


class FailoverLockError(Exception):
    """A failover lock's operation failed (its wait timed out, its file cannot be used)."""


class FailoverLock(abc.ABC):
    """Who of several engines is the active one.  Released by release(), or by the
    holder's death."""

    @abc.abstractmethod
    async def acquire(self, engine_id: str, timeout: Optional[float] = None) -> None:
        """Wait until engine_id is the active engine (timeout: seconds, None: no limit)."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give the active role up."""

    @abc.abstractmethod
    async def owner(self) -> Optional[str]:
        """The engine that took the lock last, or None."""


class FlockFailoverLock(FailoverLock):
    """The failover lock as an exclusive flock(2) of lock_path.  The holder's id is written
    into the file; owner() reads it back (the last holder's, after a release too: the
    flock, not the file's words, says whether anyone holds it)."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = str(lock_path)
        self._fd: Optional[int] = None

    async def acquire(self, engine_id: str, poll_interval: float = 0.1, timeout: Optional[float] = None) -> None:
        if self._fd is not None:
            raise FailoverLockError("%s: this lock is held already (release it first)" % self.lock_path)
        if not poll_interval > 0:
            raise ValueError("poll_interval: seconds, more than 0 (not %r)" % (poll_interval,))
        try:
            fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise FailoverLockError("%s: %s" % (self.lock_path, e.strerror)) from e
        start = time.monotonic()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # Polled, not blocked: a blocking flock would hold the event loop's thread.
                    if timeout is not None and time.monotonic() - start >= timeout:
                        raise FailoverLockError("%s: not acquired within %.3f s (held by %s)" %
                                                (self.lock_path, timeout, _read(self.lock_path) or "another"))
                    await asyncio.sleep(poll_interval)
            os.ftruncate(fd, 0)
            os.pwrite(fd, engine_id.encode(), 0)
        except BaseException:
            os.close(fd)  # a cancelled or failed wait holds nothing
            raise
        self._fd = fd

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    async def owner(self) -> Optional[str]:
        return _read(self.lock_path)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None
