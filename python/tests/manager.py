"""What systemd does for gmsfs@.service's restarts, for tests without systemd as pid 1: a
Type=notify service with FileDescriptorStoreMax= (sd_notify(3), systemd.io's "File
Descriptor Store").  It listens on $NOTIFY_SOCKET, keeps the descriptors the daemon hands
it (FDSTORE=1, FDNAME=), closes those it is told to (FDSTOREREMOVE=1), and passes the kept
ones to the next start of the daemon from descriptor 3 on, with LISTEN_FDS,
LISTEN_FDNAMES and LISTEN_PID, as systemd's restart does."""
import array
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from conftest import BUILD

STALL_S = 5  # a message left this long on the socket by the listener is said, and taken


class Manager:
    def __init__(self):
        # systemd keeps thousands of descriptors (FileDescriptorStoreMax=16384) and passes
        # them from 3 on: a soft limit of 1024 (the GPU machine's) makes dup2 past it EBADF.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.dir = tempfile.mkdtemp(prefix="gmsfs-manager.")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.fds = {}        # name -> descriptor, as the manager keeps them
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.messages = []
        self.daemon = None
        self.synced = threading.Condition(self.lock)
        self.marks = 0       # the last of the manager's own marks that the listener took
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self):
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(253 * 4), socket.MSG_CMSG_CLOEXEC)
            except OSError as e:
                # Said, not swallowed: a listener that ended here would miss READY=1.
                print("manager: recvmsg: %s" % e, file=sys.stderr, flush=True)
                continue
            if data == b"X_MANAGER_STOP=1" and not anc:
                return  # close(): the socket is closed only once this thread is gone
            try:
                self._take(data, anc)
            except Exception as e:  # noqa: BLE001 (a test's manager: say it, keep listening)
                print("manager: message %r: %r" % (data[:200], e), file=sys.stderr, flush=True)

    def _take(self, data, anc):
        """One datagram: descriptors kept or closed, READY noted, as systemd does."""
        fds = array.array("i")
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        with self.lock:
            if "X_MANAGER_MARK" in fields:  # sync(): every message before it is taken
                self.marks = int(fields["X_MANAGER_MARK"])
                self.synced.notify_all()
                return
            self.messages.append(fields)
            if fields.get("FDSTORE") == "1":
                for fd in fds:  # systemd keeps a dup; this copy is the one kept
                    old = self.fds.pop(fields.get("FDNAME", "stored"), None)
                    if old is not None:
                        os.close(old)
                    self.fds[fields.get("FDNAME", "stored")] = fd
                fds = []
            elif fields.get("FDSTOREREMOVE") == "1":
                fd = self.fds.pop(fields.get("FDNAME"), None)
                if fd is not None:
                    os.close(fd)
            if fields.get("READY") == "1":
                self.ready.set()
                self.synced.notify_all()
        for fd in fds:
            os.close(fd)

    def sync(self, timeout=20):
        """Until the listener has taken every message sent so far.  systemd reads what a
        service sent before it handles the service's end; so must this manager, or a
        restart could pass the descriptors kept before a crashed daemon's last FDSTORE,
        the one its last acknowledged commit waited for.  Datagrams keep their order:
        a mark sent now is taken after all of them."""
        with self.lock:
            mark = self.marks + 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"X_MANAGER_MARK=%d" % mark, self.path)
        self._wait(lambda: self.marks >= mark, self.synced, timeout, "the mark %d" % mark)

    def _wait(self, done, cond, timeout, what):
        """Until done() (under self.lock, cond signalled by the listener).  A listener
        that leaves a message waiting on the socket for STALL_S is said, with where it
        is, on stderr and in build/reports/manager-stalls.log, and from then on this
        thread takes the messages too: two readers of one datagram socket each get whole
        datagrams.  (A daemon that is slow to send is only waited for.)"""
        start = time.monotonic()
        said, pending_since = False, None
        while True:
            with self.lock:
                if cond.wait_for(done, 0.5):
                    return
            now = time.monotonic()
            if now - start > timeout:
                raise RuntimeError("no %s in %ds; the manager's listener is %s, at:\n%s"
                                   % (what, timeout, "alive" if self.thread.is_alive() else "dead", self._where()))
            if not said:
                waiting = select.select([self.sock], [], [], 0)[0]
                pending_since = (pending_since or now) if waiting else None
                if pending_since is not None and now - pending_since > STALL_S:
                    said = True
                    self._said_stall(what, now - pending_since)
            if said:
                self._drain()

    def _said_stall(self, what, waited):
        text = "manager: a message waited %.1f s on the socket untaken (waiting for %s); the listener is %s, at:\n%s" % (
            waited, what, "alive" if self.thread.is_alive() else "dead", self._where())
        print(text, file=sys.stderr, flush=True)
        reports = os.path.join(BUILD, "reports")
        os.makedirs(reports, exist_ok=True)
        with open(os.path.join(reports, "manager-stalls.log"), "a") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + text + "\n")

    def _drain(self):
        """Take what waits on the socket now, in this thread."""
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(253 * 4),
                                                    socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            self._take(data, anc)

    def _where(self):
        """Where the listener thread is now (its stack), for an error."""
        import traceback
        frame = sys._current_frames().get(self.thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)"

    def names(self):
        self.sync()
        with self.lock:
            return sorted(self.fds)

    def start(self, mnt, *options, env=None, timeout=60):
        """gmsfs -f -o OPTIONS MNT under this manager; returns once READY=1 came."""
        self.sync()  # what the last daemon sent, taken before its descriptors are passed on
        with self.lock:
            names = list(self.fds)
            passed = [self.fds[n] for n in names]
        self.ready.clear()
        e = dict(os.environ if env is None else env, NOTIFY_SOCKET=self.path)
        e.pop("LISTEN_FDS", None)
        e.pop("LISTEN_FDNAMES", None)
        if passed:
            e["LISTEN_FDS"] = str(len(passed))
            e["LISTEN_FDNAMES"] = ":".join(names)

        # The kept descriptors go to 3, 4, ... in the daemon, as systemd passes them:
        # posix_spawn's dup2 actions put each in its place (no Python runs in the child, which
        # a fork of this threaded process must not: the listener could hold a lock).  Not
        # bash's exec N<&M: it makes 10 and up close-on-exec.  The sources are dup'ed above
        # every target first, close-on-exec, so that none is overwritten before it is read.
        high = [fcntl_dupfd(fd, 3 + len(passed) + 16) for fd in passed]
        self.log = open(mnt + ".log", "a")
        since = self.log.tell()  # this start's lines, for the error below
        actions = [(os.POSIX_SPAWN_DUP2, self.log.fileno(), 1), (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2)]
        actions += [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(high)]
        # GMSFS_WRAP: a checker to run the daemon under (tests/variant.sh: valgrind).
        argv = os.environ.get("GMSFS_WRAP", "").split() + [os.path.join(BUILD, "gmsfs"), "-f"] + \
            (["-o", ",".join(options)] if options else []) + [mnt]
        # LISTEN_PID is the daemon's own pid: sh's $$, which exec keeps.
        try:
            pid = os.posix_spawn("/bin/sh", ["sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh"] + argv, e,
                                 file_actions=actions)
        finally:
            for fd in high:
                os.close(fd)
        self.daemon = Spawned(pid)
        try:
            self._wait(self.ready.is_set, self.synced, timeout, "READY=1")
        except RuntimeError as err:
            with open(mnt + ".log") as f:
                f.seek(since)
                said = f.read()[-3000:]
            rc = self.daemon.poll()
            raise RuntimeError("gmsfs sent no READY=1 in %ds (%s); its log: %s\n%s" % (
                timeout, "still running" if rc is None else "it ended with %d" % rc, said, err)) from None
        return self.daemon

    def kill(self, sig=signal.SIGKILL):
        """The daemon killed (as a crash), or stopped with SIGTERM (as systemctl restart's
        stop): the mount it leaves is lifted, as the next start does."""
        self.daemon.send_signal(sig)
        self.daemon.wait(20)

    def stop_service(self):
        """systemctl stop: the manager flushes its store (the memory is freed)."""
        with self.lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()

    def close(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.stop_service()
        # The listener ends first, then its socket closes: closed under a thread blocked in
        # recvmsg, the descriptor number would go to the next manager's socket, and this
        # thread would take that manager's messages (its READY=1).
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"X_MANAGER_STOP=1", self.path)
        self.thread.join(20)
        if self.thread.is_alive():
            raise RuntimeError("manager: the listener did not end")
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def fcntl_dupfd(fd, low):
    """A close-on-exec copy of fd numbered low or above."""
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)


class Spawned:
    """The daemon's process, as much of subprocess.Popen as the tests use."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        """Until it ends, woken by its end (a pidfd), as systemd is by SIGCHLD: a restart's
        time is not a polling interval's."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            fd = None  # reaped already, or no pidfd here: napping below
        try:
            while self.poll() is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired("gmsfs", timeout)
                if fd is None:
                    time.sleep(0.005)
                else:
                    select.select([fd], [], [], min(left, 1.0) if left is not None else 1.0)
        finally:
            if fd is not None:
                os.close(fd)
        return self.returncode

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def wait_mounted(mnt, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        with open("/proc/mounts") as f:
            if " %s fuse.gmsfs " % mnt in f.read():
                return True
        time.sleep(0.02)
    return False
