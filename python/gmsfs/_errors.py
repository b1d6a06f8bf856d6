"""What a failed call raises, and the waits a signal interrupts (PEP 475)."""
import errno as _errno
import numbers as _numbers
import time as _time


class GmsfsError(OSError):
    """A libgmsfs call failed: errno is the error code, strerror the library's message."""


class StaleLayoutError(GmsfsError):
    """remap_all: the committed layout's structure changed while the connection slept."""


def _raise(e, what, g=None):
    from ._lib import lib as _c  # loaded by now: a call failed
    e = -e
    msg = _c.gmsfs_errmsg(g).decode(errors="replace") if g else _c.gmsfs_strerror(-e).decode()
    cls = StaleLayoutError if e == _errno.ESTALE else GmsfsError
    raise cls(e, "%s: %s" % (what, msg or _c.gmsfs_strerror(-e).decode()))


_TIMEOUT_MAX_S = 7 * 86400  # a week, within a C int of milliseconds


def _ms(timeout):
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, _numbers.Real) or not (0 <= timeout <= _TIMEOUT_MAX_S):
        # nan fails both comparisons; inf, and past a C int of milliseconds, the second
        raise ValueError("timeout %r: seconds from 0 to %d, or None to wait as long as it takes" %
                         (timeout, _TIMEOUT_MAX_S))
    return int(timeout * 1000)


def _waiting(timeout_ms, call, what):
    """call(ms) until it is not interrupted, as Python retries a system call since PEP 475:
    a signal ends libgmsfs's wait (GMSFS_EINTR), the interpreter runs its handlers when
    call returns (one that raises ends the wait with its exception), and the wait goes on
    with what is left of the timeout.  call's last result; a wait that ran out after a
    signal raises ETIMEDOUT naming the whole timeout and what waited."""
    deadline = None if timeout_ms <= 0 else _time.monotonic() + timeout_ms / 1000
    ms = timeout_ms
    while True:
        e = call(ms)
        if e == -_errno.ETIMEDOUT and ms != timeout_ms:
            raise GmsfsError(_errno.ETIMEDOUT, "%s: lock not granted within %d ms" % (what, timeout_ms))
        if e != -_errno.EINTR:
            return e
        if deadline is not None:
            # Past the deadline: done, as libgmsfs's own retry is (signals every
            # millisecond would otherwise end every 1 ms try and the loop never).
            left = deadline - _time.monotonic()
            if left <= 0:
                raise GmsfsError(_errno.ETIMEDOUT, "%s: lock not granted within %d ms" % (what, timeout_ms))
            ms = max(1, int(left * 1000))
