"""gmsfsctl: look at gmsfs mounts from a shell, without taking any lock.

    gmsfsctl list [--json] [MOUNT...]     every store of every mount (or of those named)
    gmsfsctl wait STORE [--timeout S]     until STORE has a committed layout (for scripts)
    gmsfsctl show STORE [--json]          the layout: allocations and entries
    gmsfsctl path NAME [--gpu N] [--root DIR]
                                          the store NAME on this process's GPU (nvidia-smi's
                                          first, or the N-th): ROOT/GPU-<uuid>/NAME
    gmsfsctl metrics [MOUNT...] [--textfile DIR | --listen [HOST]:PORT] [--root DIR]
                                          every mount's metrics as one text; --textfile: into
                                          DIR/gmsfs-<device>.prom each, atomically (rename),
                                          for node_exporter's textfile collector; --listen:
                                          served over HTTP at /metrics, read at each scrape

Everything comes from files that never lock or wait: status.json and the tree's names,
sizes and extended attributes.  None waits without bound on a daemon that does not
answer (stopped, stuck): each read of a mount is given READ_S seconds, in a thread of its
own, and a mount that does not answer in time is said down (list and metrics go on with
the others).  Exit status 0; 1 when waiting timed out, a mount does not answer or a path
is not a gmsfs mount or store; 2 for bad usage."""
import argparse
import json
import os
import select
import sys
import time

from ._fields import read_fields
# Below both gmsfsctl's verbs and its metrics; FSTYPE, _unescape and status are this
# module's names too, as they were before _mounts.py.
from ._mounts import (FSTYPE, READ_S, NotAnswering, _fail, _read_status, _unescape, ask_all, unheld,  # noqa: F401
                      bounded, mounts, status)


def _version():
    """gmsfs has one version (the library's, the package's, the daemon's): the library's,
    loaded for this alone (gmsfsctl needs it for nothing else)."""
    try:
        from . import _lib
        return _lib.version_string
    except Exception as e:  # noqa: BLE001  said even where the library does not load
        return "unknown (libgmsfs: %s)" % e


class _VersionAction(argparse.Action):
    """--version: the library loaded when it is asked for, not at every command's start."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the version (libgmsfs's) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print("gmsfsctl " + _version())  # on stdout, as argparse's own "version" action
        parser.exit()


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def _not_a_mount(m, why):
    """Why m is not a mount to list: a store of one says so, and what to run instead."""
    if os.path.isfile(os.path.join(m, "state")) and not os.path.isfile(os.path.join(m, "status.json")):
        return _fail("%s: a store, not a mount (gmsfsctl show %s: its layout)" % (m, m))
    return _fail("%s: not a gmsfs mount (%s)" % (m, why))


def cmd_list(args):
    where = args.mounts or mounts()
    out, bad = [], 0
    got = ask_all(_read_status, where)  # every mount at once: one stuck daemon costs READ_S once
    live = mounts()
    for m in where:
        e = got[m]
        if not isinstance(e, BaseException):
            out.append({"mount": os.path.abspath(m), **e})
            continue
        if not isinstance(e, (OSError, ValueError)):
            raise e
        why = getattr(e, "strerror", None) or e
        if args.mounts and os.path.abspath(m) not in live:  # named: each must be one
            return _not_a_mount(m, why)
        # A mount: a daemon gone (ENOTCONN) or not answering hides none of the others.
        bad = _fail("%s: not answering (%s): listed without it" % (m, why))
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return bad
    rows = [("MOUNT", "DEVICE", "STORE", "STATE", "TIER", "READERS", "WRITER", "WAITING", "ALLOCS", "ENTRIES",
             "BYTES", "HASH")]
    for m in out:
        dev = "%s %s" % (m["device"]["backend"], m["device"]["uuid"])
        if not m["stores"]:
            rows.append((m["mount"], dev, "-", "", "", "", "", "", "", "", "", ""))
        for s in m["stores"]:
            rows.append((m["mount"], dev, s["name"] + (" (removing)" if s["removing"] else ""), s["state"],
                         s["tier"].replace("moving to ", "->"), str(s["readers"]), str(s["writer"]),
                         str(s["waiting_readers"] + s["waiting_writers"]), str(s["allocations"]), str(s["entries"]),
                         _size(s["aligned_bytes"]), s["layout_hash"][:12] or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return bad


def _state(store):
    return bounded(read_fields, os.path.join(store, "state"))


def cmd_wait(args):
    """poll(2) on an open state says readable once the state changed since it was last
    read from offset 0: no busy loop, and no lock."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        fd = bounded(os.open, os.path.join(args.store, "state"), os.O_RDONLY)
    except NotAnswering as e:
        return _fail("%s: %s" % (args.store, e.strerror))
    except OSError as e:
        return _fail("%s: not a gmsfs store (%s)" % (args.store, e.strerror))
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        while True:
            text = bounded(os.pread, fd, 65536, 0).decode()
            st = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
            if st.get("layout_hash") and st.get("torn", "0") == "0":  # a torn store refuses its readers
                print(st["layout_hash"])
                return 0
            if st.get("state") == "REMOVED":
                return _fail("%s: removed while waiting" % args.store)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return _fail("%s: nothing committed after %g s (state %s)" % (args.store, args.timeout,
                                                                               st.get("state", "?")))
            bounded(p.poll, 1000 if left is None else max(1, min(1000, int(left * 1000))), seconds=1 + READ_S)
    except NotAnswering as e:
        return _fail("%s: %s" % (args.store, e.strerror))
    finally:
        os.close(fd)


def cmd_tier(args, quiet=False):
    """Where a store's memory is; with WHERE, move it there and wait until it is.  A move
    that failed leaves the store where it was: said with the store's last_error.  The whole
    of it within --timeout (and READ_S), whatever the daemon does."""
    try:  # a plain query waits for no move: READ_S alone
        return bounded(_tier, args, quiet, seconds=(args.timeout if args.where else 0) + READ_S)
    except NotAnswering as e:
        return _fail("%s: %s" % (args.store, e.strerror))


def _tier(args, quiet):
    path = os.path.join(args.store, "tier")
    try:
        if args.where:
            with open(path, "w") as f:
                f.write(args.where + "\n")
        start = time.monotonic()
        while True:
            with open(path) as f:
                now = f.read().strip()
            if not args.where or now == args.where:
                if not quiet:
                    print(now)
                return 0
            waited = time.monotonic() - start
            if waited > args.timeout or (not now.startswith("moving") and waited > 1):
                return _fail("%s: %s after %.1f s (%s)" % (args.store, now, waited,
                                                           _state(args.store).get("last_error", "")))
            time.sleep(0.01)
    except OSError as e:
        why = _state(args.store).get("last_error", "") if os.path.exists(os.path.join(args.store, "state")) else ""
        return _fail("%s: %s%s" % (args.store, e.strerror, " (%s)" % why if why else ""))


def cmd_switch(args):
    """STORE onto the device, the stores that give way going out at once (a switch); wait,
    then say how long it took and which stores went to the host tier.  Within --timeout
    (and READ_S), whatever the daemon does."""
    try:
        return bounded(_switch, args, seconds=args.timeout + 2 * READ_S)
    except NotAnswering as e:
        return _fail("%s: %s" % (args.store, e.strerror))


def _switch(args):
    store = os.path.abspath(args.store)
    if not os.path.isfile(os.path.join(store, "tier")):
        return _fail("%s: not a gmsfs store" % args.store)
    mount = os.path.dirname(store)
    others = [os.path.join(mount, n) for n in sorted(os.listdir(mount))
              if os.path.join(mount, n) != store and os.path.isfile(os.path.join(mount, n, "tier"))]

    def tier(s):
        with open(os.path.join(s, "tier")) as f:
            return f.read().strip()
    before = {s: tier(s) for s in others}
    start = time.monotonic()
    if _tier(argparse.Namespace(store=store, where="device", timeout=args.timeout), True):
        return 1
    gone = [os.path.basename(s) for s in others if before[s] == "device" and tier(s) == "host"]
    print("%s: device in %.3f s%s" % (args.store, time.monotonic() - start,
                                      "; to the host tier: " + " ".join(gone) if gone else ""))
    return 0


def _xattr(path, name, default=""):
    try:
        return os.getxattr(path, name).decode()
    except OSError:
        return default


def layout(store):
    allocs, entries = [], []
    for area, out in (("allocs", allocs), ("meta", entries)):
        root = os.path.join(store, area)
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(d, f)
                name = os.path.relpath(p, root)
                if area == "allocs":
                    out.append({"name": name, "size": os.stat(p).st_size, "tag": _xattr(p, "user.gms.tag")})
                else:
                    out.append({"key": name, "alloc": _xattr(p, "user.gms.alloc"),
                                "offset": int(_xattr(p, "user.gms.offset", "0") or 0),
                                "size": int(_xattr(p, "user.gms.size", "0") or 0),
                                "private": _xattr(p, "user.gms.private") == "1", "value_bytes": os.stat(p).st_size})
    return allocs, entries


SHOW_S = 60.0  # show walks the whole layout: a store of 100,000 allocations takes a second


def cmd_show(args):
    try:
        if not bounded(os.path.isfile, os.path.join(args.store, "state")):
            return _fail("%s: not a gmsfs store" % args.store)
        st = _state(args.store)
        allocs, entries = bounded(layout, args.store, seconds=SHOW_S)
    except NotAnswering as e:
        return _fail("%s: %s" % (args.store, e.strerror))
    if args.json:
        json.dump({"store": os.path.abspath(args.store), "state": st.get("state"), "layout_hash": st.get("layout_hash"),
                   "allocations": allocs, "entries": entries}, sys.stdout, indent=1)
        print()
        return 0
    print("%s: %s, layout %s, %d allocations, %d entries" % (args.store, st.get("state"), st.get("layout_hash") or "-",
                                                             len(allocs), len(entries)))
    for a in allocs:
        print("  allocs/%s  %s  tag %s" % (a["name"], _size(a["size"]), a["tag"]))
    for e in entries:
        print("  meta/%s -> %s+%d%s%s" % (e["key"], e["alloc"] or "?", e["offset"],
                                          " (%d bytes)" % e["size"] if e["size"] else "",
                                          " private" if e["private"] else ""))
    return 0


def cmd_path(args):
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=10).stdout.split()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return _fail("nvidia-smi: %s" % (getattr(e, "stderr", None) or e))
    if args.gpu >= len(out):
        return _fail("GPU %d: this process sees %d GPU(s)" % (args.gpu, len(out)))
    mount = os.path.join(args.root, out[args.gpu])
    if mount not in mounts():
        return _fail("%s: not a gmsfs mount (is the node's gmsfs running, /run/gmsfs shared with this pod?)" % mount)
    print(os.path.join(mount, args.name))
    return 0


def cmd_copy(args):
    """A committed store into an empty one on another mount (another GPU's): gmsfs.copy."""
    from ._load import copy
    from ._errors import GmsfsError
    t = time.monotonic()
    try:  # with --timeout, whole within it (and READ_S), whatever either daemon does
        how = copy(args.source, args.target, args.timeout) if args.timeout is None else \
            bounded(copy, args.source, args.target, args.timeout, seconds=args.timeout + READ_S)
    except NotAnswering as e:
        return _fail("%s -> %s: %s" % (args.source, args.target, e.strerror))
    except GmsfsError as e:
        return _fail(e.strerror)
    except ImportError as e:
        return _fail(str(e))
    print("%s -> %s: %s, in %.3f s" % (args.source, args.target, how, time.monotonic() - t))
    return 0


def cmd_digest(args):
    """The content hash of a store's committed bytes, told to its daemon: gmsfs.digest."""
    from ._connection import digest
    from ._errors import GmsfsError
    t = time.monotonic()
    try:  # its time is the reading of every byte: gmsfsctl's run in a child (unheld) bounds a stuck daemon
        h = digest(args.store, not args.no_record, args.timeout)
    except GmsfsError as e:
        return _fail(e.strerror)
    print("%s  %s (%.3f s%s)" % (h, args.store, time.monotonic() - t, ", not recorded" if args.no_record else ""))
    return 0


TIMEOUT_MAX = 7 * 86400  # a week: past it a timeout is a typo, not a wait


def _seconds(v):
    """--timeout: seconds, a number from 0 to a week (nan, inf, a negative or a larger one
    refused with words: exit 2)."""
    try:
        s = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("%s: not a number of seconds" % v)
    if not (0 <= s <= TIMEOUT_MAX):  # nan fails both
        raise argparse.ArgumentTypeError("%s: seconds from 0 to %d (a week)" % (v, TIMEOUT_MAX))
    return s


def _pull_seconds(v):
    """pull's --timeout: each step's, as gmsfs-peer's -t (more than 0, at most a day)."""
    try:
        s = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("%s: not a number of seconds" % v)
    if not (0 < s <= 86400):
        raise argparse.ArgumentTypeError("%s: timeout is seconds, more than 0, at most a day" % v)
    return s


def _stripes(v):
    """--stripes: the connections a pull asks for, as gmsfs-peer pull takes them."""
    if not (v.isascii() and v.isdigit()) or not 1 <= int(v) <= 16:
        raise argparse.ArgumentTypeError("%s: connections a pull, 1 to 16" % v)
    return int(v)


def cmd_pull(args):
    """A store that another node serves into an empty one here: gmsfs.pull."""
    from ._load import pull
    from ._errors import GmsfsError
    try:
        how = pull(args.url, args.target, args.token, args.timeout, progress=not args.quiet and sys.stderr.isatty(),
                   stripes=args.stripes)
    except GmsfsError as e:
        return _fail(e.strerror)
    except (ImportError, ValueError) as e:
        return _fail(str(e))
    if not args.quiet:
        print("%s -> %s: %s" % (args.url, args.target, how))
    return 0


def cmd_metrics(args):
    """Every mount's metrics, merged, into a textfile directory, or served (_ctl_metrics.py)."""
    from ._ctl_metrics import metrics
    return metrics(args)


def _verb_parsers():
    """Each verb's parser, as a function that adds it: main builds the one asked for alone
    (argparse's parsers cost a fresh command milliseconds each), all of them for help."""

    def _add_list(sub):
        p = sub.add_parser("list", help="every store of every gmsfs mount")
        p.add_argument("--json", action="store_true")
        p.add_argument("mounts", nargs="*", metavar="MOUNT")
        p.set_defaults(fn=cmd_list)

    def _add_wait(sub):
        p = sub.add_parser("wait", help="wait until a store has a committed layout; print its hash")
        p.add_argument("store", metavar="STORE")
        p.add_argument("--timeout", type=_seconds, metavar="SECONDS")
        p.set_defaults(fn=cmd_wait)

    def _add_show(sub):
        p = sub.add_parser("show", help="a store's layout: allocations and entries")
        p.add_argument("store", metavar="STORE")
        p.add_argument("--json", action="store_true")
        p.set_defaults(fn=cmd_show)

    def _add_path(sub):
        p = sub.add_parser("path", help="the store NAME on this process's GPU")
        p.add_argument("name", metavar="NAME")
        p.add_argument("--gpu", type=int, default=0, metavar="N")
        p.add_argument("--root", default="/run/gmsfs", metavar="DIR")
        p.set_defaults(fn=cmd_path)

    def _add_tier(sub):
        p = sub.add_parser("tier", help="where a store's memory is: device or host; move it")
        p.add_argument("store", metavar="STORE")
        p.add_argument("where", nargs="?", choices=("device", "host"))
        p.add_argument("--timeout", type=_seconds, default=600, metavar="SECONDS")
        p.set_defaults(fn=cmd_tier)

    def _add_switch(sub):
        p = sub.add_parser("switch", help="a store onto the device, those that give way out at once")
        p.add_argument("store", metavar="STORE")
        p.add_argument("--timeout", type=_seconds, default=600, metavar="SECONDS")
        p.set_defaults(fn=cmd_switch)

    def _add_copy(sub):
        p = sub.add_parser("copy", help="a committed store into an empty one on another mount (another GPU's)")
        p.add_argument("source", metavar="SOURCE")
        p.add_argument("target", metavar="TARGET")
        p.add_argument("--timeout", type=_seconds, metavar="SECONDS")
        p.set_defaults(fn=cmd_copy)

    def _add_digest(sub):
        p = sub.add_parser("digest", help="the content hash of a store's committed bytes, told to its daemon")
        p.add_argument("store", metavar="STORE")
        p.add_argument("--no-record", action="store_true", help="only print it (no write permission needed)")
        p.add_argument("--timeout", type=_seconds, metavar="SECONDS")
        p.set_defaults(fn=cmd_digest)

    def _add_pull(sub):
        p = sub.add_parser("pull", help="a store that another node serves (gmsfs-peer serve) into an empty one here")
        p.add_argument("url", metavar="gmsfs://HOST:PORT/NAME")
        p.add_argument("target", metavar="TARGET")
        p.add_argument("--token", required=True, metavar="FILE")
        p.add_argument("--timeout", type=_pull_seconds, default=30, metavar="SECONDS")
        p.add_argument("--stripes", type=_stripes, metavar="N")
        p.add_argument("-q", "--quiet", action="store_true")
        p.set_defaults(fn=cmd_pull)

    def _add_group(sub):
        from ._ctl_group import add_parser as add_group
        add_group(sub, _seconds)

    def _add_metrics(sub):
        p = sub.add_parser("metrics", help="every mount's metrics, merged, or into a textfile directory")
        p.add_argument("mounts", nargs="*", metavar="MOUNT")
        g = p.add_mutually_exclusive_group()
        g.add_argument("--textfile", metavar="DIR")
        g.add_argument("--listen", metavar="[HOST]:PORT")
        p.add_argument("--root", default="/run/gmsfs", metavar="DIR")
        p.set_defaults(fn=cmd_metrics)

    return {"list": _add_list, "wait": _add_wait, "show": _add_show, "path": _add_path, "tier": _add_tier,
            "switch": _add_switch, "copy": _add_copy, "digest": _add_digest, "pull": _add_pull, "group": _add_group,
            "metrics": _add_metrics}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="gmsfsctl", description="Look at gmsfs mounts without taking a lock.")
    ap.add_argument("--version", action=_VersionAction)
    sub = ap.add_subparsers(dest="cmd", required=True)
    verbs = _verb_parsers()
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    for name, add in verbs.items():
        if not words or words[0] not in verbs or words[0] == name:
            add(sub)
    args = ap.parse_args(argv)

    def work():
        try:
            return args.fn(args)
        except BrokenPipeError:  # | head: not an error
            sys.stderr.close()
            return 0
    return unheld(work) if argv is None else work()  # the command, not a caller's call


if __name__ == "__main__":
    sys.exit(main())
