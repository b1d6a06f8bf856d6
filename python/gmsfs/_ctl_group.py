"""gmsfsctl group: a model over N GPUs as one command (gmsfs.Group): its status, its
tier, a switch, a snapshot of every rank at once under one manifest, and a pull of every
rank from another node's."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from .group import Group

GROUP_FORMAT = "gmsfs-group 1"


def _fail(msg):
    print("gmsfsctl group: %s" % msg, file=sys.stderr)
    return 1


def _each(fn, items):
    """fn(i, item) for every item at once (a thread each): the results, in order."""
    out = [None] * len(items)

    def run(i, x):
        try:
            out[i] = fn(i, x)
        except Exception as e:  # said with its rank, never lost in a thread
            out[i] = e
    ts = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate(items)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def _run_all(argvs):
    """Every command started at once (no thread: each is started the moment the one before
    is), then each waited for in turn: [(exit status, its standard error)], an OSError
    where one could not start."""
    ps = []
    for argv in argvs:
        try:
            ps.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        except OSError as e:
            ps.append(e)
    out = []
    for p in ps:
        said = p if isinstance(p, OSError) else p.communicate()[1]
        out.append(said if isinstance(p, OSError) else (p.returncode, said))
    return out


def _failed_ranks(runs):
    """Each rank whose command failed, said with its rank; "" where none did."""
    return "; ".join("rank %d: %s" % (r, x if isinstance(x, OSError) else x[1].strip() or "exit status %d" % x[0])
                     for r, x in enumerate(runs) if isinstance(x, OSError) or x[0])


def _snapshot_tool():
    found = shutil.which("gmsfs-snapshot")
    if found:
        return found
    from . import _lib  # beside the library it came with (a build tree)
    return os.path.join(os.path.dirname(_lib.path), "gmsfs-snapshot")


def status(g):
    for r, (store, name, gen) in enumerate(g.status()):
        print("rank %d %s: %s (generation %d)" % (r, store, name or "no name", gen))
    p = g.pending()
    print("group: %s%s" % (g.version() or "no version on every rank",
                           "; %s on ranks %s only" % (p[0], p[1]) if p else ""))
    return 0


def tier(g, where, timeout):
    from .ctl import cmd_tier
    import argparse
    said = _each(lambda r, s: cmd_tier(argparse.Namespace(store=s, where=where, timeout=timeout), quiet=True),
                 g.stores)
    for r, (s, rc) in enumerate(zip(g.stores, said)):
        with open(os.path.join(s, "tier")) as f:
            print("rank %d %s: %s%s" % (r, s, f.read().strip(), "" if rc == 0 else " (%s)" % rc))
    return 0 if all(rc == 0 for rc in said) else 1


def snapshot(g, out, timeout):
    """Every rank saved at once into OUT/rank-N, then OUT/group.json last: the group's
    version and each rank's store and hashes.  Refused where the group has no version
    every rank serves, or where a rank was committed during the save (nothing then says
    the ranks are one version: no group.json)."""
    v = g.version()
    before = g.status()
    if v is None or g.pending() or any(name != v for _, name, _ in before):
        return _fail("%s: the ranks serve %s: a snapshot takes one version on every rank (gmsfsctl group status)"
                     % (out, [name for _, name, _ in before]))
    os.makedirs(out, exist_ok=True)
    tool = _snapshot_tool()
    t = time.monotonic()
    args = ["-t", str(timeout)] if timeout else []
    bad = _failed_ranks(_run_all([tool, "save", s, os.path.join(out, "rank-%d" % r), "-q"] + args
                                 for r, s in enumerate(g.stores)))
    if bad:
        return _fail(bad)
    if g.status() != before:
        return _fail("%s: a rank was committed during the save: the ranks' snapshots are not one version; "
                     "no group.json written" % out)
    ranks = []
    for r, s in enumerate(g.stores):
        with open(os.path.join(out, "rank-%d" % r, "manifest.json")) as f:
            m = json.load(f)
        ranks.append({"store": s, "dir": "rank-%d" % r, "layout_hash": m["layout_hash"],
                      "content_hash": m.get("content_hash")})
    tmp = os.path.join(out, "group.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"format": GROUP_FORMAT, "version": v, "ranks": ranks}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(out, "group.json"))
    print("%s: %d ranks of version %s saved in %.3f s" % (out, len(ranks), v, time.monotonic() - t))
    return 0


def restore(g, src, timeout):
    """Every rank restored at once from SRC/rank-N, each checked by gmsfs-snapshot against
    its manifest before it commits, the commit named the group's version: engines of the
    group (gmsfs.Group.connect) see that version on every rank, or none."""
    try:
        with open(os.path.join(src, "group.json")) as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        return _fail("%s: no group manifest (group.json): %s" % (src, e))
    if man.get("format") != GROUP_FORMAT or len(man.get("ranks", [])) != len(g):
        return _fail("%s: a snapshot of %d ranks (%s); the group has %d" % (
            src, len(man.get("ranks", [])), man.get("format"), len(g)))
    tool = _snapshot_tool()
    t = time.monotonic()
    args = ["-t", str(timeout)] if timeout else []
    bad = _failed_ranks(_run_all([tool, "restore", s, os.path.join(src, man["ranks"][r]["dir"]), "--version",
                                  man["version"], "-q"] + args for r, s in enumerate(g.stores)))
    if bad:
        return _fail(bad + " (the group has no version until every rank is restored)")
    print("%s: %d ranks of version %s restored in %.3f s" % (src, len(g), man["version"], time.monotonic() - t))
    return 0


def pull(g, sources, token, timeout):
    """Every rank pulled at once from another node's group: SOURCES names one gmsfs:// URL
    a line, in rank order; each pull carries its source commit's version name.  Refused
    (exit status 1) where the pulls do not give every rank one version (the source group
    was mid-refit, or a rank failed): its engines then connect to none."""
    from ._load import pull as pull_one
    try:
        with open(sources) as f:
            urls = [line.split("#", 1)[0].strip() for line in f]
    except OSError as e:
        return _fail("%s: %s" % (sources, e.strerror))
    urls = [u for u in urls if u]
    if len(urls) != len(g):
        return _fail("%s: %d URLs for a group of %d ranks (one a line, in rank order)" % (sources, len(urls), len(g)))
    t = time.monotonic()
    said = _each(lambda r, s: pull_one(urls[r], s, token, min(timeout, 86400), progress=False), g.stores)
    bad = [(r, x) for r, x in enumerate(said) if isinstance(x, Exception)]
    if bad:
        return _fail("; ".join("rank %d: %s" % (r, getattr(x, "strerror", None) or x) for r, x in bad) +
                     " (the group has no version until every rank is pulled)")
    names = [name for _, name, _ in g.status()]
    if g.version() is None or any(n != names[0] for n in names):
        return _fail("the ranks pulled are versions %s, not one: the source group was not one version (pull again "
                     "once it is)" % names)
    print("%d ranks of version %s pulled in %.3f s" % (len(g), names[0], time.monotonic() - t))
    return 0


def cmd_group(args):
    try:
        g = Group.open(args.group)
    except (OSError, ValueError) as e:
        return _fail(str(e))
    if args.what == "status":
        return status(g)
    if args.what == "tier":
        if args.arg not in (None, "device", "host"):
            return _fail("tier: device or host, not %s" % args.arg)
        return tier(g, args.arg, args.timeout)
    if args.what == "switch":
        return tier(g, "device", args.timeout)
    if not args.arg:
        return _fail("%s: %s" % (args.what, "a file of URLs" if args.what == "pull" else "a directory"))
    if args.what == "pull":
        if not args.token:
            return _fail("pull: --token FILE (the token the peers share)")
        return pull(g, args.arg, args.token, args.timeout)
    return snapshot(g, args.arg, args.timeout) if args.what == "snapshot" else restore(g, args.arg, args.timeout)


def add_parser(sub, seconds):
    p = sub.add_parser("group", help="a model over N GPUs (a group file: a store a line): status, tier, switch, "
                                     "snapshot, restore, pull")
    p.add_argument("what", choices=("status", "tier", "switch", "snapshot", "restore", "pull"))
    p.add_argument("group", metavar="GROUP")
    p.add_argument("arg", nargs="?", metavar="WHERE|DIR|URLS")
    p.add_argument("--token", metavar="FILE", help="pull: the token the peers share")
    p.add_argument("--timeout", type=seconds, default=600, metavar="SECONDS")
    p.set_defaults(fn=cmd_group)
