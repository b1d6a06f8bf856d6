#!/usr/bin/env python3
"""lockfuzz.py MOUNT SEQUENCES [SEED]: random sequences of lock requests on fresh stores of
a live mount, checking after every step that no waiter waits while its store could be
granted to it (gmsfs(5), "Waiting"), and at the end of each sequence that every waiter
got an answer in time.

Each sequence drives four actor processes on one new store.  An actor does one thing at a
time: open STORE/lock read-only, for writing or O_RDWR (RW_OR_RO), blocking or with
O_NONBLOCK; take the lock with the ioctl and a timeout (a session of its own, GMSFS_LOCK_OWN,
in some); make an allocation; write commit or abort; connect for writing through libgmsfs
(timed), commit and close in one request (COMMIT_LEAVE); close what it holds.  The driver also kills actors with SIGKILL.  After each step it
reads the store's state until the rule holds (the kernel reports closes late, so a rule
may hold a moment later), and fails if it does not within two seconds:
  - nobody holds the store: no writer waits, and readers wait only for a first commit;
  - only readers hold it: no reader waits unless a writer waits (writers go first).
A timed wait must be answered by its deadline (plus a second for a loaded machine).
Prints TAP-style comments on failure with the sequence's history; exits 1 then."""
import json
import os
import random
import select
import subprocess
import sys
import time

ACTOR = r"""
import errno, fcntl, json, os, struct, sys
held, n = [], 0
IOC_LOCK = (3 << 30) | (248 << 16) | (0xE6 << 8) | 2   # _IOWR(0xE6, 2, struct gmsfs_ioc)
def reply(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    c = json.loads(line)
    op, store = c["op"], c["store"]
    try:
        if op == "open":
            flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}[c["mode"]]
            held.append(os.open(store + "/lock", flags | (os.O_NONBLOCK if c["nb"] else 0)))
        elif op == "ioctl":
            fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
            buf = bytearray(248)
            struct.pack_into("<IIIi", buf, 0, 248, 2 if c.get("own") else 0, c["mode"], c["timeout"])  # GMSFS_LOCK_OWN
            try:
                fcntl.ioctl(fd, IOC_LOCK, buf)
            except OSError:
                os.close(fd)
                raise
            held.append(fd)
        elif op == "alloc":
            n += 1
            name = "%s/allocs/a%d-%d" % (store, os.getpid(), n)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)
            os.ftruncate(fd, 4096)
            os.close(fd)
        elif op in ("commit", "abort"):
            fd = os.open(store + "/" + op, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
        elif op == "leave":  # libgmsfs's writer that commits and closes in one request
            if "gmsfs" not in sys.modules:
                sys.path.insert(0, os.environ["LOCKFUZZ_PYTHON"])
            import gmsfs
            gmsfs.connect(store, "rw", timeout=c["timeout"] / 1000).commit(close=True)
        elif op == "close":
            while held:
                os.close(held.pop())
        reply(ok=True)
    except OSError as e:
        reply(ok=False, errno=e.errno)
"""

RO, RW, RW_OR_RO = 1, 2, 3


class Unkillable(Exception):
    pass


class Actor:
    """A process that does what it is told to a store, one thing at a time; it lives on
    from sequence to sequence (a new store each), unless it is killed."""

    def __init__(self):
        # stderr not inherited: an actor the kernel keeps must not hold the caller's pipes.
        python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        self.p = subprocess.Popen([sys.executable, "-c", ACTOR], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                  env=dict(os.environ, LOCKFUZZ_PYTHON=python))
        self.busy = None        # the command in flight
        self.deadline = None    # a timed wait must be answered by then
        self.store = None

    def send(self, cmd):
        cmd["store"] = self.store
        self.busy = cmd
        self.deadline = time.monotonic() + cmd["timeout"] / 1000 + 1.0 if cmd.get("timeout", -1) > 0 else None
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def poll(self):
        """The reply of the command in flight, if it came."""
        if self.busy and select.select([self.p.stdout], [], [], 0)[0]:
            line = self.p.stdout.readline()
            self.busy = self.deadline = None
            return json.loads(line) if line else {"ok": False, "dead": True}
        return None

    def kill(self):
        self.p.kill()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:  # its request still in the daemon: a lost interrupt
            raise Unkillable("actor %d (%s) did not end 30 s after SIGKILL: the daemon never answered its "
                             "request" % (self.p.pid, self.busy))
        self.p.stdin.close()
        self.p.stdout.close()


def state(store):
    with open(store + "/state") as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def broken(s):
    """Why the state breaks the rule, or None."""
    readers, writer = int(s["readers"]), int(s["writer"])
    ww, wr = int(s["waiting_writers"]), int(s["waiting_readers"])
    if writer and readers:
        return "a writer together with readers"
    if not writer and not readers and ww:
        return "nobody holds the store and %d writer(s) wait" % ww
    if not writer and not readers and wr and s["state"] != "EMPTY":
        return "nobody holds a committed store and %d reader(s) wait" % wr
    if not writer and readers and wr and not ww:
        return "only readers hold it, no writer waits, and %d reader(s) wait" % wr
    return None


def settle(store, actors, history):
    """Collect replies; the rule must hold within 2 s; a timed wait past its deadline fails."""
    end = time.monotonic() + 2.0
    while True:
        for a in actors:
            r = a.poll()
            if r is not None:
                history.append("  reply %d: %s" % (actors.index(a), r))
            if a.deadline and time.monotonic() > a.deadline:
                return "actor %d's timed wait (%s) was not answered by its deadline" % (actors.index(a), a.busy)
        why = broken(state(store))
        if not why:
            return None
        if time.monotonic() > end:
            return why + " for 2 s: " + json.dumps(state(store))
        time.sleep(0.001)


def random_step(rng, actors):
    idle = [i for i, a in enumerate(actors) if not a.busy]
    if not idle or rng.random() < 0.08:
        return rng.randrange(len(actors)), {"op": "kill"}
    i = rng.choice(idle)
    k = rng.random()
    if k < 0.40:  # RW_OR_RO most: engines start so, and its waiters are the ones that change kind
        return i, {"op": "open", "mode": rng.choice(["r", "w", "rw", "rw", "rw"]), "nb": rng.random() < 0.15}
    if k < 0.55:
        # A session of its own (GMSFS_LOCK_OWN) waits as another process's would, for its own
        # actor's reads too: timed, as GMS's are (untimed, an actor could wait for itself).
        own = rng.random() < 0.3
        return i, {"op": "ioctl", "mode": rng.choice([RO, RW, RW_OR_RO]), "own": own,
                   "timeout": rng.choice([50, 300] if own else [-1, 50, 300])}
    if k < 0.63:
        return i, {"op": "alloc"}
    if k < 0.74:
        return i, {"op": "commit"}
    if k < 0.78:  # connect for writing (timed), commit, close: COMMIT_LEAVE (gmsfs(5))
        return i, {"op": "leave", "timeout": rng.choice([50, 300])}
    if k < 0.83:
        return i, {"op": "abort"}
    return i, {"op": "close"}


def sequence(mount, n, rng, actors):
    store = os.path.join(mount, "fuzz%d" % n)
    os.mkdir(store)
    for a in actors:
        a.store = store
    history = []
    try:
        return steps(store, rng, actors, history)
    except Unkillable as e:
        return "%s; the store: %s" % (e, json.dumps(state(store))), history


def steps(store, rng, actors, history):
    try:
        for step in range(rng.randrange(4, 14)):
            i, cmd = random_step(rng, actors)
            history.append("step %d: actor %d %s" % (step, i, cmd))
            if cmd["op"] == "kill":
                actors[i].kill()
                actors[i] = Actor()
                actors[i].store = store
            else:
                actors[i].send(cmd)
            why = settle(store, actors, history)
            if why:
                return why, history
        # The end: whoever holds lets go; every waiter must then be answered, but a reader
        # of a store where nothing was ever committed, which waits for a first commit.
        closed = set()
        end = time.monotonic() + 5.0
        while True:
            for i, a in enumerate(actors):
                if not a.busy and i not in closed:
                    a.send({"op": "close"})
                    closed.add(i)
            why = settle(store, actors, history)
            if why:
                return why, history
            busy = [a for a in actors if a.busy]
            if not busy:
                break
            s = state(store)
            if (s["state"] == "EMPTY" and int(s["waiting_readers"]) == len(busy) and
                    all(a.busy["op"] == "open" and a.busy["mode"] == "r" or
                        a.busy["op"] == "ioctl" and a.busy["mode"] == RO for a in busy)):
                history.append("  end: %d reader(s) wait for a first commit" % len(busy))
                break
            if time.monotonic() > end:
                return "waiters never answered once every holder let go: %s" % s, history
            time.sleep(0.002)
        return None, history
    finally:
        # Every actor lets go of this store before the next: one still waiting (a reader
        # of an empty store, or a failure) or that does not answer a close is replaced.
        for i, a in enumerate(actors):
            if not a.busy:
                a.send({"op": "close"})
                end = time.monotonic() + 1.0
                while a.poll() is None and time.monotonic() < end:
                    time.sleep(0.001)
            if a.busy:
                a.kill()
                actors[i] = Actor()
        for _ in range(200):
            try:
                os.rmdir(store)
                break
            except OSError:
                time.sleep(0.01)


def main():
    mount, count = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.randrange(1 << 30)
    rng = random.Random(seed)
    steps = 0
    t = time.monotonic()
    actors = [Actor() for _ in range(4)]
    for n in range(count):
        why, history = sequence(mount, n, rng, actors)
        steps += sum(1 for h in history if h.startswith("step"))
        if why:
            print("# seed %d, sequence %d: %s" % (seed, n, why))
            for h in history:
                print("#   " + h)
            sys.exit(1)
    for a in actors:
        a.kill()
    print("# %d sequences, %d steps, seed %d, %.1f s" % (count, steps, seed, time.monotonic() - t))


if __name__ == "__main__":
    main()
