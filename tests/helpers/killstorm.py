#!/usr/bin/python3
"""killstorm MOUNT DAEMON_PID KILLS BUILD: SIGKILL writers and readers at random points.

Shell writers (exec 9>STORE/lock), libgmsfs writers (new allocations, or the committed
ones written in place), libgmsfs writers that import the last commit and write only
allocations of their own, and libgmsfs readers run side by side on one store; one of them
is killed every few milliseconds and replaced, KILLS times.  After each kill the state
must never show a writer together with readers.  An in-place writer killed mid-write
leaves the store TORN: readers are refused (EUCLEAN) until a writer that writes every byte
commits; shell writers, which do not, leave a torn store as they found it.  No other
writer ever tears it: a store seen TORN with no in-place writer killed since the last
heal fails.
Every 50 kills everything is stopped and checked (a torn store first shown refusing
reads, then emptied by a session that commits):
  - the layout hash, recomputed from the tree with the encoding of gmsfs(5), is the
    one the daemon published;
  - every entry names an existing allocation, inside it;
  - the device's used_bytes is what the stores' layouts hold;
  - the daemon's descriptors do not grow;
  - no reader ever saw bytes that were not its layout's (it would exit 1).
Prints one line per check and "kills=N checks=M"; exits 1 at the first failure."""
import errno
import os
import random
import signal
import struct
import subprocess
import sys
import time

mount, daemon, kills_wanted, build = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = os.path.join(mount, "ks")
storm = os.path.join(build, "gmsfs-storm")
random.seed(int(os.environ.get("KILLSTORM_SEED", "1")))


def state(path=store):
    with open(os.path.join(path, "state")) as f:
        return dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)


def fail(why):
    print("FAIL:", why, flush=True)
    sys.exit(1)


SHELL_WRITER = r"""
exec 9>"$S/lock" || exit 0
[ "$(sed -n 's/^torn: //p' "$S/state")" = 0 ] || exit 0 # its commit would publish torn bytes
rm -f "$S/meta/sh" "$S/allocs/sh"
truncate -s $((4096 * (RANDOM % 4 + 1))) "$S/allocs/sh"
echo -n "v$RANDOM" > "$S/meta/sh"
setfattr -n user.gms.alloc -v sh "$S/meta/sh"
setfattr -n user.gms.size -v 16 "$S/meta/sh"
sleep 0.0$((RANDOM % 5))
echo > "$S/commit"
sleep 0.0$((RANDOM % 3))
"""


def spawn(kind):
    env = dict(os.environ, S=store)
    if kind == "shell":
        cmd = ["bash", "-c", SHELL_WRITER]
    elif kind in ("libwriter", "libinplace", "libimporter"):
        cmd = [storm, kind, store, str(random.randrange(1, 1 << 20))]
    else:
        cmd = [storm, "libreader", store]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def reap(p, killed):
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    # A reader ends only when killed (or, wrongly, on bad bytes: exit 1).
    if p.returncode not in (0, -signal.SIGKILL) and not (killed and p.returncode < 0):
        fail("%s exited %s: %s" % (p.args[1] if p.args[0] == storm else "shell writer", p.returncode, err))


def daemon_fds():
    """The daemon's descriptors, less libfuse's: each FUSE worker thread holds a clone of
    /dev/fuse (clone_fd), and workers come and go with the load (many under valgrind)."""
    fds = "/proc/%d/fd" % daemon
    return sum(1 for f in os.listdir(fds) if _readlink(os.path.join(fds, f)) != "/dev/fuse")


def _readlink(p):
    try:
        return os.readlink(p)
    except OSError:
        return None


def tree(area):
    root = os.path.join(store, area)
    for d, dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            yield os.path.relpath(p, root), p


def xattr(p, name, default=None):
    try:
        return os.getxattr(p, name).decode()
    except OSError:
        return default


def recompute():
    """The layout hash of gmsfs(5), from the tree, under a read lock."""
    fd = os.open(os.path.join(store, "lock"), os.O_RDONLY)
    try:
        allocs = sorted((rel.encode(), p) for rel, p in tree("allocs"))
        entries = sorted((rel.encode(), p) for rel, p in tree("meta"))
        sizes = {}
        enc = [b"GMSFSLH2", struct.pack("<Q", len(allocs))]
        for rel, p in allocs:
            size, tag = os.stat(p).st_size, xattr(p, "user.gms.tag", "").encode()
            sizes[rel.decode()] = size
            enc += [struct.pack("<I", len(rel)), rel, struct.pack("<Q", size), struct.pack("<I", len(tag)), tag]
        enc.append(struct.pack("<Q", len(entries)))
        for rel, p in entries:
            alloc = xattr(p, "user.gms.alloc", "")
            off, ext = int(xattr(p, "user.gms.offset", "0")), int(xattr(p, "user.gms.size", "0"))
            flags = 1 if xattr(p, "user.gms.private") == "1" else 0
            with open(p, "rb") as f:
                value = f.read()
            if alloc not in sizes or off >= sizes[alloc] or off + ext > sizes[alloc]:
                fail("meta/%s names %s at %d+%d, not inside an allocation" % (rel.decode(), alloc, off, ext))
            a = alloc.encode()
            enc += [struct.pack("<I", len(rel)), rel, struct.pack("<I", len(a)), a, struct.pack("<QQI", off, ext, flags),
                    struct.pack("<I", len(value)), value]
        out = subprocess.run(["xxhsum", "-H2"], input=b"".join(enc), capture_output=True, check=True)
        return out.stdout.split()[0].decode()
    finally:
        os.close(fd)


def quiesce(live):
    for p in live:
        if p.poll() is None:
            p.kill()
        p.wait()
        reap(p, True)
    live.clear()
    for _ in range(200):
        s = state()
        if s["writer"] == "0" and s["readers"] == "0" and s["waiting_writers"] == "0" and s["waiting_readers"] == "0":
            return s
        time.sleep(0.025)
    fail("the store did not come to rest: %s" % state())


def heal_torn(n, s):
    """A torn store refuses readers and says why; a session that removes everything and
    commits makes it whole (and empty).  True when it was torn."""
    global torn, inplace_killed
    if s["state"] != "TORN":
        return False
    if not inplace_killed:
        fail("after %d kills the store is TORN, yet no in-place writer was killed since the last heal" % n)
    inplace_killed = False
    torn += 1
    if "TORN" not in s["last_error"] or s["torn"] != "1":
        fail("after %d kills: state TORN, yet %s" % (n, s))
    try:
        os.close(os.open(os.path.join(store, "lock"), os.O_RDONLY))
        fail("after %d kills a read lock was granted on a torn store" % n)
    except OSError as e:
        if e.errno != errno.EUCLEAN:
            fail("after %d kills a read of a torn store failed with %s, not EUCLEAN" % (n, e))
    subprocess.run(["bash", "-ec", 'exec 9>"$S/lock"; rm -rf "$S"/allocs/* "$S"/meta/*; echo > "$S/commit"'],
                   env=dict(os.environ, S=store), check=True)
    s = state()
    if s["state"] != "COMMITTED" or s["torn"] != "0":
        fail("after %d kills a commit did not heal a torn store: %s" % (n, s))
    return True


def check(n):
    s = quiesce(live)
    healed = heal_torn(n, s)
    mine = recompute()
    s = state()
    if mine != s["layout_hash"]:
        fail("after %d kills the tree hashes to %s, the daemon says %s" % (n, mine, s["layout_hash"]))
    with open(os.path.join(mount, "device")) as f:
        used = int(dict(l.rstrip("\n").split(": ", 1) for l in f)["used_bytes"])
    held = sum(int(state(os.path.join(mount, d))["aligned_bytes"]) for d in os.listdir(mount)
               if os.path.isdir(os.path.join(mount, d)))
    if used != held:
        fail("after %d kills the device says %d bytes used, the layouts hold %d" % (n, used, held))
    # A killed client's socket connection is closed by its daemon thread when that
    # thread sees the hangup: give it a moment (valgrind makes it long), then count.
    for _ in range(100):
        fds = daemon_fds()
        if fds <= base_fds + 8:
            break
        time.sleep(0.05)
    else:
        held = sorted(str(_readlink("/proc/%d/fd/%s" % (daemon, f))) for f in os.listdir("/proc/%d/fd" % daemon))
        fail("after %d kills the daemon has %d descriptors, %d at the start: %s" % (n, fds, base_fds, held))
    print("# %d kills: layout %s recomputed, %d bytes used, %d daemon descriptors, generation %s%s" %
          (n, mine, used, fds, s["generation"], ", torn and healed" if healed else ""), flush=True)


os.mkdir(store)
subprocess.run(["bash", "-c", 'exec 9>"$S/lock"; truncate -s 4096 "$S/allocs/w0"; echo > "$S/commit"'],
               env=dict(os.environ, S=store), check=True)
base_fds = daemon_fds()
live, kills, checks, torn, tearing, inplace_killed = [], 0, 0, 0, 0, False
kinds = ["shell", "shell", "libwriter", "libinplace", "libimporter", "libreader", "libreader"]
while kills < kills_wanted:
    while len(live) < 4:
        live.append(spawn(random.choice(kinds)))
    time.sleep(random.uniform(0.005, 0.06))
    for p in [p for p in live if p.poll() is not None]:  # ended on their own (shell writers do)
        live.remove(p)
        reap(p, False)
    victim = random.choice(live)
    victim.kill()
    victim.wait()
    live.remove(victim)
    reap(victim, True)
    kills += 1
    inplace_killed |= victim.args[1] == "libinplace"
    s = state()
    if s["torn"] == "1" and not inplace_killed:
        fail("after kill %d (%s): the store is TORN, yet no in-place writer was killed since the last heal" %
             (kills, victim.args[1] if victim.args[0] == storm else "shell writer"))
    if s["writer"] != "0" and s["readers"] != "0":
        fail("after kill %d: a writer (%s) together with %s readers" % (kills, s["writer"], s["readers"]))
    tearing += victim.args[1] == "libinplace" and s["torn"] == "1"
    if kills % 50 == 0:
        check(kills)
        checks += 1
if kills % 50:
    check(kills)
    checks += 1
# tearing: in-place writers killed after which the store was torn; torn: checks that found it so.
print("kills=%d checks=%d tearing=%d torn=%d" % (kills, checks, tearing, torn))
