"""The gmsfs mounts this process sees, and reads of them bounded in time: what gmsfsctl's
verbs and its metrics (_ctl_metrics.py) share, below both."""
import errno
import json
import os
import sys
import threading
import time

READ_S = 5.0  # what one read of a mount may take before it is said down (gmsfsctl(8))

FSTYPE = "fuse.gmsfs"


def _unescape(field):
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def mounts():
    """The gmsfs mount points this process sees, in /proc/self/mounts order."""
    with open("/proc/self/mounts") as f:
        return [_unescape(line.split()[1]) for line in f if line.split()[2:3] == [FSTYPE]]


class NotAnswering(OSError):
    """A mount's daemon did not answer within READ_S (stopped or stuck)."""


def bounded(fn, *args, seconds=None):
    """fn(*args), given seconds (READ_S): a daemon that is stopped or stuck holds the
    thread that asked in the kernel, not gmsfsctl (a daemon thread: the process's end
    ends its request).  NotAnswering when it does not return in time."""
    seconds = READ_S if seconds is None else seconds
    box = {}

    def run():
        try:
            box["v"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 (raised again in the caller's thread)
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise NotAnswering(errno.ETIMEDOUT, "does not answer within %g s (its daemon stopped or stuck?)" % seconds)
    if "e" in box:
        raise box["e"]
    return box["v"]


def unheld(work):
    """work() in a child process, whose exit status this process returns the moment work
    returns.  A daemon that read a request and does not answer (stuck in a driver call,
    its lock held) holds the thread that asked in the kernel, where no signal ends it, and
    a process with such a thread cannot be reaped: its parent (a shell, a probe, timeout)
    would wait with it, whatever bound bounded() kept.  The child, its output closed,
    ends with the daemon.  SIGINT, SIGTERM and SIGHUP are passed on, and a SIGKILL of the
    command ends the child too (PR_SET_PDEATHSIG)."""
    import signal
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the command killed, its work ends
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(137)  # it already was
        try:
            rc = work()
        except SystemExit as e:
            rc = e.code
        except BaseException:  # noqa: BLE001 (said as Python says it, exit 1)
            import traceback
            traceback.print_exc()
            rc = 1
        if rc is None:
            rc = 0
        elif not isinstance(rc, int):
            print(rc, file=sys.stderr)
            rc = 1
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        sys.stderr.flush()
        os.write(w, bytes([rc & 255]))
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # a thread left in the kernel would keep them, and our reader waiting
            os.dup2(null, fd)
        os._exit(rc & 255)
    os.close(w)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    got = os.read(r, 1)
    if got:
        # Its end: the pipe's other end closes with its last thread, and with it every file
        # it held (its read locks too), at once unless a thread is left in the kernel.
        import select
        if select.select([r], [], [], 1.0)[0] and not os.read(r, 1):
            os.waitpid(pid, 0)
        return got[0]  # else reaped by whoever outlives us
    _, st = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(st)
    return code if code >= 0 else 128 - code  # killed by a signal: as a shell says it


def ask_all(fn, items, seconds=None):
    """fn(item) for every item at once, all given seconds (READ_S): {item: result or the
    exception}; one that does not answer is NotAnswering."""
    seconds = READ_S if seconds is None else seconds
    out = {}

    def run(x):
        try:
            out[x] = fn(x)
        except BaseException as e:  # noqa: BLE001
            out[x] = e
    threads = [threading.Thread(target=run, args=(x,), daemon=True) for x in items]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {x: out.get(x, NotAnswering(errno.ETIMEDOUT, "does not answer within %g s (its daemon stopped or "
                                                       "stuck?)" % seconds)) for x in items}


def _read_status(mount):
    with open(os.path.join(mount, "status.json")) as f:
        return json.load(f)


def status(mount):
    return bounded(_read_status, mount)


def _fail(msg):
    print("gmsfsctl: " + msg, file=sys.stderr)
    return 1
