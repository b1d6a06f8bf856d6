#!/usr/bin/python3
"""check_status MOUNT [EXPECT...]: status.json (a JSON parser) and metrics (Prometheus's
text parser, python3-prometheus-client) agree with every store's state file and with
device, read in the same quiet moment.  Each EXPECT is STORE:METRIC=VALUE for a
counter (commits, aborts, lock_waits, exports).  Prints what differs; exits 1 if any."""
import json
import os
import sys

from prometheus_client.parser import text_string_to_metric_families

mount = sys.argv[1]
bad = []


def kv(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)


def same(what, a, b):
    if str(a) != str(b):
        bad.append("%s: %r != %r" % (what, a, b))


with open(os.path.join(mount, "status.json")) as f:
    status = json.load(f)
with open(os.path.join(mount, "metrics")) as f:
    families = {fam.name: fam for fam in text_string_to_metric_families(f.read())}
device = kv(os.path.join(mount, "device"))
stores = sorted(d for d in os.listdir(mount) if os.path.isdir(os.path.join(mount, d)))

for k in ("index", "gpu", "uuid", "name", "backend", "total_bytes", "used_bytes", "granularity"):
    same("status.json device.%s" % k, status["device"][k], device[k])
same("status.json version", status["version"], device["version"])
# The names before 0.3, kept one release: the same values as the names that say what they are.
for new, old in (("host_standby_bytes", "host_kept_bytes"), ("pages_spare_bytes", "pages_kept_bytes")):
    same("device %s (%s's alias)" % (old, new), device[old], device[new])
    same("status.json device.%s" % new, status["device"][new], device[new])
    same("status.json device.%s" % old, status["device"][old], device[new])
same("status.json stores", [s["name"] for s in status["stores"]], stores)


def metric(family, store, **labels):
    """The value of family's sample for store (and labels); None if absent."""
    fam = families.get(family)
    for s in fam.samples if fam else ():
        if s.labels.get("store") == store and all(s.labels.get(k) == v for k, v in labels.items()):
            same("%s %s's device labels" % (family, store),
                 (s.labels.get("device"), s.labels.get("gpu"), s.labels.get("UUID")), DEVICE_LABELS)
            return s.value
    return None


# device, and dcgm-exporter's gpu and UUID: every series has them.
DEVICE_LABELS = (device["uuid"], device["gpu"], device["uuid"])

for name, js in zip(stores, status["stores"]):
    st = kv(os.path.join(mount, name, "state"))
    for k in ("state", "readers", "writer", "waiting_writers", "waiting_readers", "generation", "torn", "allocations",
              "entries", "bytes", "aligned_bytes", "layout_hash", "requests", "socket_requests", "last_error",
              "quota", "priority", "min", "reserved", "used", "peak", "reclaim", "pages_spare", "pages_kept"):
        if k not in ("requests",):  # reading state does not count, reading status.json does not either
            same("status.json %s.%s" % (name, k), js[k], st.get(k, ""))
    same("state %s pages_kept (pages_spare's alias)" % name, st["pages_kept"], st["pages_spare"])
    for s in ("EMPTY", "RW", "COMMITTED", "RO", "TORN"):
        same("metrics %s state %s" % (name, s), metric("gmsfs_store_state", name, state=s),
             1.0 if st["state"] == s else 0.0)
    same("metrics %s readers" % name, metric("gmsfs_store_readers", name), float(st["readers"]))
    same("metrics %s writer" % name, metric("gmsfs_store_writer", name), 1.0 if st["writer"] != "0" else 0.0)
    same("metrics %s waiting read" % name, metric("gmsfs_store_waiting", name, lock="read"),
         float(st["waiting_readers"]))
    same("metrics %s waiting write" % name, metric("gmsfs_store_waiting", name, lock="write"),
         float(st["waiting_writers"]))
    for fam, k in (("gmsfs_store_allocations", "allocations"), ("gmsfs_store_entries", "entries"),
                   ("gmsfs_store_bytes", "aligned_bytes")):
        same("metrics %s %s" % (name, k), metric(fam, name), float(st[k]))
    for fam, k in (("gmsfs_store_min_bytes", "min"), ("gmsfs_store_reserved_bytes", "reserved"),
                   ("gmsfs_store_used_bytes", "used"), ("gmsfs_store_peak_bytes", "peak"),
                   ("gmsfs_store_reclaim_bytes", "reclaim"), ("gmsfs_store_quota_bytes", "quota")):
        same("metrics %s %s" % (name, k), metric(fam, name), float(st[k]))
    for c in ("commits", "aborts", "lock_waits", "exports"):
        same("metrics %s %s_total against status.json" % (name, c), metric("gmsfs_store_%s" % c, name),
             float(js[c]))
    # The hashes as labels: the committed layout's, and the content hash or "unknown".
    with open(os.path.join(mount, name, "layout_hash")) as f:
        lh = f.read().strip()
    same("metrics %s info" % name, metric("gmsfs_store_info", name, layout_hash=lh,
                                          content_hash=js.get("content_hash") or "unknown"), 1.0)
for fam in ("gmsfs_device_used_bytes", "gmsfs_device_total_bytes"):
    smp = families[fam].samples
    same("metrics %s" % fam, [(s.labels, s.value) for s in smp],
         [({"device": device["uuid"], "gpu": device["gpu"], "UUID": device["uuid"]}, float(device[fam[13:]]))])
for fam in ("gmsfs_host_tier_standby_bytes", "gmsfs_host_tier_kept_bytes"):  # the second: its alias before 0.3
    same("metrics %s" % fam, [s.value for s in families[fam].samples], [float(device["host_standby_bytes"])])
for want in sys.argv[2:]:
    where, value = want.split("=")
    store, counter = where.rsplit(":", 1)
    js = next((s for s in status["stores"] if s["name"] == store), {})
    same("%s %s" % (store, counter), js.get(counter), value)
for line in bad:
    print(line)
print("# %d stores checked, %d differences" % (len(stores), len(bad)))
sys.exit(1 if bad else 0)
