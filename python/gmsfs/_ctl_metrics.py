"""gmsfsctl metrics: every mount's metrics merged, written into a textfile directory for
node_exporter, or served (--listen); a mount whose daemon does not answer is up 0."""
import os
import sys
import threading
import time

from ._mounts import FSTYPE, _fail, _read_status, _unescape, ask_all, mounts


def _families(text):
    """A metrics text as [(name, header lines, sample lines)], in its order."""
    fams, cur = [], None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            cur = (line.split()[2], [line], [])
            fams.append(cur)
        elif line.startswith("# ") and cur:
            cur[1].append(line)
        elif line and cur:
            cur[2].append(line)
    return fams


_UP_HEAD = ["# HELP gmsfs_up Whether the mount's daemon answers (1) or its mount is dead or gone (0).",
            "# TYPE gmsfs_up gauge"]


def _esc(v):
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_REPLACED_HEAD = ["# HELP gmsfs_daemon_replaced_total Daemons gmsfs-node replaced for not answering (stopped or "
                  "stuck; GMSFS_HUNG_S).", "# TYPE gmsfs_daemon_replaced_total counter"]


def _labelled(name, device, mount, value):
    """device: (uuid, index or None): the labels the daemon's series have (device, and
    dcgm-exporter's gpu and UUID)."""
    uuid, index = device
    gpu = ',gpu="%d"' % index if index is not None else ""
    return '%s{device="%s"%s,UUID="%s",mount="%s"} %d' % (name, _esc(uuid), gpu, _esc(uuid), _esc(mount), value)


def _up(device, mount, value):
    return _labelled("gmsfs_up", device, mount, value)


def _dead_device(textfile, mount):
    """A dead mount's device: named in the .prom file written while it lived (its up series),
    else its mount source (gmsfs-node's is the GPU's uuid)."""
    want = 'mount="%s"' % _esc(mount)
    for name in sorted(os.listdir(textfile)) if textfile else ():
        if name.startswith("gmsfs-") and name.endswith(".prom"):
            with open(os.path.join(textfile, name)) as f:
                for line in f:
                    if line.startswith("gmsfs_up{") and want in line:
                        gpu = line.split('gpu="', 1)[1].split('"', 1)[0] if 'gpu="' in line else None
                        return name[len("gmsfs-"):-len(".prom")], int(gpu) if gpu else None
    return _mount_source(mount), None


def _gone(textfile, written):
    """The .prom files in textfile of mounts not written now (a clean stop lifted them, or
    the mount is no more): {path: up-0 line}, from the up line each was written with."""
    out = {}
    for name in sorted(os.listdir(textfile)):
        path = os.path.join(textfile, name)
        if not (name.startswith("gmsfs-") and name.endswith(".prom")) or path in written:
            continue
        with open(path) as f:
            ups = [line.rstrip("\n") for line in f if line.startswith("gmsfs_up{")]
        if ups:
            out[path] = ups[0].rsplit(" ", 1)[0] + " 0"
    return out


def _mount_source(mount):
    with open("/proc/self/mounts") as f:
        for line in f:
            part = line.split()
            if part[2:3] == [FSTYPE] and _unescape(part[1]) == mount:
                return _unescape(part[0])
    return "unknown"


def _read_mount(m):
    """(uuid, index, metrics text) of a mount; OSError or ValueError when it does not answer
    (unbounded: called in a thread of ask_all's or the scraper's)."""
    with open(os.path.join(m, "metrics")) as f:
        text = f.read()
    dev = _read_status(m)["device"]
    return dev["uuid"], dev.get("gpu", dev.get("index")), text  # gpu: the label (an older daemon: index)


def _merge(texts, ups):
    """Several mounts' metrics as one text: one HELP and TYPE per family; the device labels
    keep the series apart; gmsfs_up last."""
    merged = {}
    for text in texts:
        for name, head, samples in _families(text):
            merged.setdefault(name, (head, []))[1].extend(samples)
    merged["gmsfs_up"] = (_UP_HEAD, ups)
    return "".join("\n".join(head + samples) + "\n" for head, samples in merged.values())


def metrics(args):
    """Every mount's metrics, and gmsfs_up for each: a mount whose daemon died is up 0 (and
    its textfile has nothing else: no stale series), the others are still written; then
    exit status 1, saying which."""
    if args.listen:
        return _serve_metrics(args)
    live = mounts()
    where = [os.path.abspath(m) for m in args.mounts] or live
    if args.textfile and not os.path.isdir(args.textfile):
        return _fail("--textfile %s: not a directory" % args.textfile)
    texts, dead, gone = {}, [], {}
    got = ask_all(_read_mount, where)  # every mount at once, each given READ_S
    for m in where:
        r = got[m]
        if not isinstance(r, BaseException):
            uuid, index, text = r
            texts[m] = ((uuid, index), text)
        elif isinstance(r, (OSError, ValueError, KeyError)):
            if m not in live:
                return _fail("%s: not a gmsfs mount (%s)" % (m, getattr(r, "strerror", None) or r))
            dead.append(m)
        else:
            raise r
    ups = {m: _up(dev, m, 1) for m, (dev, _) in texts.items()}
    devs = {m: _dead_device(args.textfile, m) for m in dead}
    ups.update({m: _up(devs[m], m, 0) for m in dead})
    if args.textfile:
        files = {m: (dev[0], text + "\n".join(_UP_HEAD + [ups[m]]) + "\n") for m, (dev, text) in texts.items()}
        for m in dead:
            files[m] = (devs[m][0], "\n".join(_UP_HEAD + [ups[m]]) + "\n")
        paths = {os.path.join(args.textfile, "gmsfs-%s.prom" % uuid): text for uuid, text in files.values()}
        # A mount written before and not now (a clean stop, a GPU no more): up 0 and no
        # other series, not its last scrape's.  Named mounts only write what they name.
        gone = {} if args.mounts else _gone(args.textfile, paths)
        paths.update({p: "\n".join(_UP_HEAD + [up]) + "\n" for p, up in gone.items()})
        for path, text in paths.items():
            tmp = "%s.%d.tmp" % (path, os.getpid())  # node_exporter reads *.prom only
            with open(tmp, "w") as f:
                f.write(text)
            os.rename(tmp, path)  # never a half-written file for the collector
        for path, up in gone.items():
            print("gmsfsctl: %s: its mount is gone (gmsfs_up 0)" % up.split('mount="', 1)[-1].split('"', 1)[0],
                  file=sys.stderr)
    else:
        sys.stdout.write(_merge([text for _, text in texts.values()], [ups[m] for m in where]))
    for m in dead:
        print("gmsfsctl: %s: its daemon does not answer (gmsfs_up 0)" % m, file=sys.stderr)
    return 1 if dead or gone else 0


class _Scraper:
    """What --listen serves: at each scrape, every mount asked at once, each given
    READ_S; a mount that does not answer in time, is dead, or is gone is up 0 and has no
    other series.  Which mounts: those named, else every gmsfs mount now, and the GPUs
    gmsfs-node lists in ROOT/.gmsfs-node (a GPU whose mount is gone is still up 0).  A
    mount whose last read still hangs is not asked again until it returns: one stuck
    daemon holds one thread, not one per scrape."""
    READ_S = 2.0

    def __init__(self, named, root):
        self.named, self.root = named, root
        self.lock = threading.Lock()
        self.busy = set()       # mounts whose read has not returned
        self.known = {}         # mount -> (uuid, index) as last read: a dead one keeps its labels

    def listed(self):
        """gmsfs-node's GPUs, in nvidia-smi's order: {mount: (uuid, index)}, the labels of a
        GPU whose mount is dead or gone, first seen or not (one series per GPU)."""
        try:
            with open(os.path.join(self.root, ".gmsfs-node")) as f:
                return {os.path.join(self.root, u): (u, i) for i, u in enumerate(f.read().split())}
        except OSError:
            return {}

    def mounts(self):
        if self.named:
            return self.named
        where = mounts()
        return where + [m for m in self.listed() if m not in where]

    def replaced(self, listed):
        """gmsfs_daemon_replaced_total of each GPU gmsfs-node lists (ROOT/.gmsfs-node-replaced)."""
        counts = {}
        try:
            with open(os.path.join(self.root, ".gmsfs-node-replaced")) as f:
                counts = {l.split()[0]: int(l.split()[1]) for l in f if len(l.split()) == 2}
        except (OSError, ValueError):
            pass
        return [_labelled("gmsfs_daemon_replaced_total", dev, m, counts.get(dev[0], 0)) for m, dev in listed.items()]

    def _ask(self, m, out):
        try:
            out[m] = _read_mount(m)
        except (OSError, ValueError, KeyError):
            pass
        finally:
            with self.lock:
                self.busy.discard(m)

    def scrape(self):
        where, out, threads = self.mounts(), {}, []
        for m in where:
            with self.lock:
                if m in self.busy:
                    continue
                self.busy.add(m)
            t = threading.Thread(target=self._ask, args=(m, out), daemon=True)
            t.start()
            threads.append(t)
        deadline = time.monotonic() + self.READ_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        got = dict(out)  # what came in time
        texts, ups = [], []
        listed = {} if self.named else self.listed()
        for m in where:
            if m in got:
                uuid, index, text = got[m]
                self.known[m] = (uuid, index)
                texts.append(text)
                ups.append(_up((uuid, index), m, 1))
            else:
                dev = listed.get(m) or self.known.get(m) or (_mount_source(m) if m in mounts() else os.path.basename(m),
                                                             None)
                ups.append(_up(dev, m, 0))
        text = _merge(texts, ups)
        if listed:
            text += "\n".join(_REPLACED_HEAD + self.replaced(listed)) + "\n"
        return text


def _serve_metrics(args):
    """gmsfsctl metrics --listen [HOST]:PORT: the node's metrics over HTTP, /metrics, for
    Prometheus (the DaemonSet's Service and ServiceMonitor), until SIGTERM."""
    import http.server
    import signal
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        return _fail("--listen %s: not [HOST]:PORT" % args.listen)
    scraper = _Scraper([os.path.abspath(m) for m in args.mounts], args.root)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics")
                return
            body = scraper.scrape().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):  # a scrape every few seconds: not worth a line each
            pass

    http.server.ThreadingHTTPServer.daemon_threads = True
    try:
        server = http.server.ThreadingHTTPServer((host.strip("[]") or "", int(port)), Handler)
    except OSError as e:
        return _fail("--listen %s: %s" % (args.listen, e.strerror or e))
    signal.signal(signal.SIGTERM, lambda *_: _stop_later(server))
    print("gmsfsctl: metrics on http://%s:%d/metrics" % (host or "0.0.0.0", server.server_address[1]),
          file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


def _stop_later(server):
    """SIGTERM: serve_forever ends (shutdown waits for it, so from another thread)."""
    import threading
    threading.Thread(target=server.shutdown, daemon=True).start()
