import ctypes
import errno
"""gmsfs-load and gmsfs-save (host backend): safetensors files written here with struct
and json (several dtypes, an empty tensor, a sharded index), loaded into a store,
materialized into a torch module with the right values, saved back identical; malformed
files refused by name with the store left as it was."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest
import torch

from conftest import BUILD

import gmsfs
import gmsfs.torch as gt
import gmsfs._torch_materialize as _tm

LOAD, SAVE = os.path.join(BUILD, "gmsfs-load"), os.path.join(BUILD, "gmsfs-save")
DT = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I8": np.int8, "U8": np.uint8, "F64": np.float64}


def write_st(path, tensors, header_extra=None, raw=None):
    """tensors: {name: (dtype, numpy array)}; raw: replace the file's bytes after the fact."""
    header, blobs, at = {}, [], 0
    for name, (dt, a) in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    header["__metadata__"] = {"format": "pt"}
    header.update(header_extra or {})
    h = json.dumps(header).encode()
    data = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    with open(path, "wb") as f:
        f.write(raw(data) if raw else data)


def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def model_tensors(seed=0):
    r = np.random.default_rng(seed)
    return {
        "embed.weight": ("F32", r.standard_normal((16, 8)).astype(np.float32)),
        "layers.0.w": ("F16", r.standard_normal((8, 8)).astype(np.float16)),
        "layers.0.ids": ("I64", np.arange(5, dtype=np.int64)),
        "layers.0.q": ("I8", np.arange(-4, 4, dtype=np.int8).reshape(2, 4)),
        "layers.0.mask": ("U8", np.array([1, 0, 1], dtype=np.uint8)),
        "empty": ("F32", np.zeros((0, 4), dtype=np.float32)),
        "scale": ("F64", np.array(3.5)),
    }


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        L = self.layers[0]
        L.register_buffer("w", torch.zeros(8, 8, dtype=torch.float16))
        L.register_buffer("ids", torch.zeros(5, dtype=torch.int64))
        L.register_buffer("q", torch.zeros(2, 4, dtype=torch.int8))
        L.register_buffer("mask", torch.zeros(3, dtype=torch.uint8))
        self.register_buffer("empty", torch.zeros(0, 4))
        self.register_buffer("scale", torch.zeros((), dtype=torch.float64))


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def state(store):
    with open(os.path.join(store, "state")) as f:
        return dict(l.rstrip("\n").split(": ", 1) for l in f if ": " in l)


def test_load_materialize_save_round_trip(store, tmp_path):
    t = model_tensors()
    write_st(tmp_path / "model.safetensors", t)
    r = run(LOAD, store, str(tmp_path / "model.safetensors"))
    assert r.returncode == 0 and r.stderr == "", r.stderr  # quiet when not on a terminal
    assert state(store)["state"] == "COMMITTED" and state(store)["entries"] == str(len(t) + 1)  # and the source note
    m = Model()
    with gmsfs.connect(store, "ro") as c:
        gt.materialize(m, c)
        got = dict(m.named_parameters(), **dict(m.named_buffers()))
        for name, (dt, a) in t.items():
            assert got[name].dtype == getattr(torch, {"F32": "float32", "F16": "float16", "I64": "int64", "I8": "int8",
                                                      "U8": "uint8", "F64": "float64"}[dt])
            assert np.array_equal(got[name].numpy(), a), name
        e = c.meta_json("torch/layers.0.w")
        assert e["source"] == "model.safetensors" and e["stride"] == [8, 1]
    out = tmp_path / "out"  # made by gmsfs-save, as its man page shows
    r = run(SAVE, store, str(out))
    assert r.returncode == 0, r.stderr
    assert read_st(out / "model.safetensors") == read_st(tmp_path / "model.safetensors")
    r = run(SAVE, store, str(tmp_path / "no" / "such"))  # one level only, as mkdir(1)
    assert r.returncode != 0 and "No such file or directory" in r.stderr, r.stderr


def test_layers_of_one_kind_lie_side_by_side(store, tmp_path):
    """gmsfs-load places a file's tensors kind by kind: the file's layer-by-layer order,
    cut by the slabs' ends, would leave a reader runs of two or three layers to view."""
    r = np.random.default_rng(3)
    t = {}
    for i in range(8):
        t["layers.%d.q" % i] = ("F16", r.standard_normal((16, 8)).astype(np.float16))  # 256 bytes: 512 apart
        t["layers.%d.k" % i] = ("F16", r.standard_normal((4, 8)).astype(np.float16))
        t["layers.%d.norm" % i] = ("F32", r.standard_normal(8).astype(np.float32))
    write_st(tmp_path / "model.safetensors", t)
    r = run(LOAD, "--slab", "5000", store, str(tmp_path / "model.safetensors"))  # slack at its end
    assert r.returncode == 0, r.stderr
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        groups = [g[-1] for g in _tm._manifest(c).groups]
        assert len(c.mappings) == 3  # 24 tensors 512 bytes apart, 10 a slab
        assert len(groups) == 3 + 2, groups  # a run per kind, each slab's end cutting one
        m = torch.nn.Module()
        m.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(8)])
        for L in m.layers:
            L.register_buffer("q", torch.zeros(16, 8, dtype=torch.float16))
            L.register_buffer("k", torch.zeros(4, 8, dtype=torch.float16))
            L.register_buffer("norm", torch.zeros(8))
        gt.materialize(m, c)
        for i, L in enumerate(m.layers):
            for kind in ("q", "k", "norm"):
                assert np.array_equal(getattr(L, kind).numpy(), t["layers.%d.%s" % (i, kind)][1])
    out = tmp_path / "out"
    assert run(SAVE, store, str(out)).returncode == 0
    assert read_st(out / "model.safetensors") == read_st(tmp_path / "model.safetensors")


def test_sharded_index(store, tmp_path):
    t = model_tensors(1)
    names = list(t)
    write_st(tmp_path / "model-00001-of-00002.safetensors", {k: t[k] for k in names[:3]})
    write_st(tmp_path / "model-00002-of-00002.safetensors", {k: t[k] for k in names[3:]})
    wm = {k: "model-0000%d-of-00002.safetensors" % (1 if i < 3 else 2) for i, k in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    r = run(LOAD, "-q", store, str(tmp_path))
    assert r.returncode == 0, r.stderr
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        assert sorted(k[6:] for k in c.meta_list("torch/")) == sorted(names)
        assert c.meta_json("torch/" + names[4])["source"] == "model-00002-of-00002.safetensors"


BAD = [
    ("truncated data", lambda d: d[:-3], None, "data_offsets outside the file's data"),
    ("header length past the end", lambda d: struct.pack("<Q", 1 << 40) + d[8:], None, "header length passes the end"),
    ("shorter than 8 bytes", lambda d: d[:5], None, "shorter than the 8 bytes"),
    ("bad JSON", lambda d: d[:8] + b"x" + d[9:], None, "JSON:"),
    ("unknown dtype", None, {"odd": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}}, "tensor odd: unknown dtype"),
    ("shape against size", None, {"odd": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
     "tensor odd: shape and dtype do not match"),
    ("overlap", None, {"odd": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, "overlaps another tensor's"),
    ("negative size", None, {"odd": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, "not a non-negative integer"),
]


@pytest.mark.parametrize("what,raw,extra,message", BAD, ids=[b[0] for b in BAD])
def test_malformed_files_are_refused_and_change_nothing(store, tmp_path, what, raw, extra, message):
    write_st(tmp_path / "ok.safetensors", {"a": ("F32", np.ones(4, dtype=np.float32))})
    assert run(LOAD, store, str(tmp_path / "ok.safetensors")).returncode == 0
    before = state(store)
    write_st(tmp_path / "bad.safetensors", {"a": ("F32", np.ones(4, dtype=np.float32))}, extra, raw)
    empty = store + "-2"
    os.mkdir(empty)
    for target in (store, empty):
        r = run(LOAD, target, str(tmp_path / "bad.safetensors"))
        assert r.returncode == 1 and "bad.safetensors" in r.stderr and message in r.stderr, r.stderr
    after = state(store)
    assert (after["layout_hash"], after["generation"], after["entries"]) == \
        (before["layout_hash"], before["generation"], before["entries"])
    assert state(empty)["state"] == "EMPTY"


def test_a_store_with_allocations_is_refused(store, tmp_path):
    write_st(tmp_path / "m.safetensors", {"a": ("U8", np.arange(3, dtype=np.uint8))})
    with gmsfs.connect(store, "rw") as c:  # a layout of no checkpoint gmsfs-load recorded
        c.create("x", 4096)
        c.commit()
    r = run(LOAD, store, str(tmp_path / "m.safetensors"))
    assert r.returncode == 1 and "holds allocations already, of no checkpoint gmsfs-load recorded" in r.stderr
    r = run(LOAD, store, str(tmp_path / "none.safetensors"))
    assert r.returncode == 1 and "none.safetensors: No such file" in r.stderr
    assert run(LOAD, store).returncode == 2


def test_the_same_checkpoint_again_copies_nothing_and_another_needs_replace(store, tmp_path):
    """gmsfs-load records the checkpoint's files in the note %gmsfs.source (names, sizes,
    times, inodes): the same checkpoint again is no copy and no commit; the file rewritten
    in place with the same shapes (other bytes) is refused, then loaded with --replace."""
    path = tmp_path / "m.safetensors"
    write_st(path, {"a": ("U8", np.arange(3, dtype=np.uint8)), "b": ("F32", np.ones(4, dtype=np.float32))})
    assert run(LOAD, store, str(path)).returncode == 0
    source = json.loads(open(os.path.join(store, "meta", "%gmsfs.source"), "rb").read())
    st = os.stat(path)
    assert source == {"generation": 1, "files": [{"name": "m.safetensors", "size": st.st_size,
                                                  "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}]}
    before = state(store)
    r = run(LOAD, store, str(path))
    assert r.returncode == 0 and "nothing copied" in r.stdout, r.stderr
    assert run(LOAD, "-q", store, str(path)).stdout == ""
    assert state(store)["generation"] == before["generation"] and state(store)["state"] == "COMMITTED"

    write_st(path, {"a": ("U8", np.arange(7, 10, dtype=np.uint8)), "b": ("F32", np.ones(4, dtype=np.float32))})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # the same shapes: only its time tells
    r = run(LOAD, store, str(path))
    assert r.returncode == 1 and "of another checkpoint, of files changed since" in r.stderr, r.stderr
    assert state(store)["generation"] == before["generation"]
    r = run(LOAD, "--replace", store, str(path))
    assert r.returncode == 0, r.stderr
    assert int(state(store)["generation"]) == int(before["generation"]) + 1
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        e = c.meta_get("torch/a")
        assert ctypes.string_at(e.ptr, 3) == bytes([7, 8, 9])
        assert [m.name for m in c.mappings] == ["torch/load00000"]
    assert run(LOAD, store, str(path)).stdout.endswith("nothing copied\n")
    # Committed again since (a data-only writer's change in place, as a refit): not the
    # checkpoint's bytes any more, whatever the files say.
    with gmsfs.connect(store, "data") as w:
        w.import_all()
        ctypes.memset(w.meta_get("torch/a").ptr, 0, 1)
        w.commit()
    r = run(LOAD, store, str(path))
    assert r.returncode == 1 and "or committed again since" in r.stderr, r.stderr
    assert run(LOAD, "-q", "--replace", store, str(path)).returncode == 0
    assert run(LOAD, store, str(path)).stdout.endswith("nothing copied\n")


def test_a_load_tells_the_content_hash_of_the_bytes_as_they_passed(store, tmp_path):
    """gmsfs-load hashes each slab's 2 MiB pieces as they pass through host memory (tensors
    from two shards crossing pieces and slabs, the bytes between them zeros) and tells the
    daemon the content hash after its commit: what gmsfs.digest computes from the store's
    own bytes.  --no-digest, or a caller that commits itself, leaves it unknown."""
    r = np.random.default_rng(7)
    shards = {}
    for k in range(2):
        t = {"s%d.t%d" % (k, i): ("F32", r.standard_normal(int(r.integers(1, 3 << 20)) // 4).astype(np.float32))
             for i in range(5)}
        t["s%d.tiny" % k] = ("U8", np.arange(3, dtype=np.uint8))
        write_st(tmp_path / ("m-%d.safetensors" % k), t)
        shards.update({n: "m-%d.safetensors" % k for n in t})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    p = run(LOAD, "-v", "--slab", str(5 << 20), store, str(tmp_path))
    assert p.returncode == 0 and "content hash " in p.stderr, p.stderr
    told = gmsfs.content_hash(store)
    assert told and told == gmsfs.digest(store, record=False) and state(store)["allocations"] != "1"
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        for name in shards:  # the values as the files hold them
            e = c.meta_get("torch/" + name)
            assert ctypes.string_at(e.ptr, e.size) == read_st(tmp_path / shards[name])[name][2], name

    other = empty_store(store, "bare")
    p = run(LOAD, "-v", "--no-digest", "--slab", str(5 << 20), other, str(tmp_path))
    assert p.returncode == 0 and "content hash" not in p.stderr, p.stderr
    assert gmsfs.content_hash(other) is None and gmsfs.digest(other, record=False) == told
    for commit in (True, False):  # in this process: told when gmsfs.load commits, not when the caller does
        mine = empty_store(store, "py%d" % commit)
        with gmsfs.connect(mine, "rw") as c:
            assert gmsfs.load(c, tmp_path, commit=commit)
            if not commit:
                c.commit()
        assert gmsfs.content_hash(mine) == (gmsfs.digest(mine, record=False) if commit else None)


def test_a_hub_caches_files_are_noted_with_their_sha256(store, tmp_path):
    """A checkpoint in a Hugging Face hub cache (snapshots/REV/NAME links to blobs/SHA256):
    the source note records each file's SHA-256 as the hub names it, the same checkpoint
    again copies nothing, and Python's view of the source agrees."""
    from gmsfs._load import source
    blob = tmp_path / "blobs" / ("%064x" % 0xabc)
    blob.parent.mkdir()
    write_st(blob, {"a": ("U8", np.arange(3, dtype=np.uint8))})
    snap = tmp_path / "snapshots" / "rev"
    snap.mkdir(parents=True)
    os.symlink(os.path.join("..", "..", "blobs", blob.name), snap / "model.safetensors")
    assert run(LOAD, store, str(snap)).returncode == 0
    noted = json.loads(open(os.path.join(store, "meta", "%gmsfs.source"), "rb").read())
    assert noted["files"][0]["sha256"] == blob.name and noted["files"] == source(snap)
    assert run(LOAD, store, str(snap)).stdout.endswith("nothing copied\n")


SNAP = os.path.join(BUILD, "gmsfs-snapshot")


def snapshot_source(store):
    """A layout with nested allocations, tags, entries with extents, a private entry and a
    binary value; its layout hash."""
    with gmsfs.connect(store, "rw") as c:
        a = c.create("layers/0/w", 10000, tag="weights")
        b = c.create("kv", 4096, tag="kv_cache")
        c.buffer(a.ptr, a.size)[:] = bytes(range(256)) * 39 + bytes(16)
        c.buffer(b.ptr, 4)[:] = b"\x00\x01\xfe\xff"
        for i in range(6):  # more allocations than one shard: several shards, written at once
            m = c.create("many/%d" % i, (3 << 20) + i * 4096)
            c.buffer(m.ptr, m.size)[:] = bytes([i + 1]) * m.size
        c.meta_put_many([("cfg/json", "layers/0/w", 16, '{"dtype": "f16"}', 64),
                         ("scale", "kv", 0, b"\x00\xff\x10", 4, True), ("plain", "kv")])
        c.commit()
        return c.layout_hash


def empty_store(store, name):
    path = store + "-" + name
    os.mkdir(path)
    return path


def refused_and_untouched(target, r, words):
    assert r.returncode == 1 and words in r.stderr, r.stderr
    st = state(target)
    assert st["state"] == "EMPTY" and st["allocations"] == "0" and st["writer"] == "0", st


def test_snapshot_restores_the_same_layout_hash(store, tmp_path):
    """Saved in shards with a manifest last, restored into another store: the same hash,
    bytes and entries; every allocation's bytes checked as they come."""
    want = snapshot_source(store)
    snap = tmp_path / "snap"
    r = run(SNAP, "save", store, str(snap))
    assert r.returncode == 0, r.stderr
    man = json.loads((snap / "manifest.json").read_text())
    assert man["format"] == "gmsfs-snapshot 2" and man["layout_hash"] == want
    assert len(man["shards"]) > 1 and sorted(os.listdir(snap)) == sorted(
        ["manifest.json"] + [sh["file"] for sh in man["shards"]])
    for sh in man["shards"]:
        assert (snap / sh["file"]).stat().st_size == sh["size"]
    other = empty_store(store, "copy")
    r = run(SNAP, "restore", other, str(snap))
    assert r.returncode == 0, r.stderr
    assert state(other)["layout_hash"] == want
    with gmsfs.connect(other, "ro") as c:
        c.import_all()
        a = c.find("layers/0/w")
        assert (a.tag, a.size) == ("weights", 10000)
        assert bytes(c.buffer(a.ptr, a.size)) == bytes(range(256)) * 39 + bytes(16)
        for i in range(6):
            m = c.find("many/%d" % i)
            assert bytes(c.buffer(m.ptr, m.size)) == bytes([i + 1]) * m.size
        e = c.meta_get("scale")
        assert (e.private, e.value, e.size) == (True, b"\x00\xff\x10", 4)
    r = run(SNAP, "restore", other, str(snap))  # not into a store with a layout
    assert r.returncode == 1 and "holds allocations already" in r.stderr
    # The content hash, from the pieces the copies hashed as they passed: recorded in the
    # manifest, told to the daemon on both sides, the one gmsfs_digest computes.
    assert man["content_hash"] == gmsfs.content_hash(store) == gmsfs.content_hash(other)
    assert gmsfs.digest(other, record=False) == man["content_hash"]


def test_a_snapshot_without_a_content_hash_restores_and_tells_it(store, tmp_path):
    """A manifest of a save before the content hash restores, its hash told all the same;
    one whose content_hash is edited (every allocation's bytes as saved) or not hex is
    refused, nothing restored."""
    snapshot_source(store)
    snap = tmp_path / "snap"
    assert run(SNAP, "save", store, str(snap)).returncode == 0
    text = (snap / "manifest.json").read_text()
    man = json.loads(text)
    h = man["content_hash"]
    target = empty_store(store, "t")
    for bad, why in [(h[:31] + ("0" if h[31] != "0" else "1"), "edited or damaged, nothing restored"),
                     ("xyz", "content_hash is not 32 hex digits")]:
        (snap / "manifest.json").write_text(text.replace('"content_hash": "%s"' % h, '"content_hash": "%s"' % bad))
        refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), why)
    (snap / "manifest.json").write_text(text.replace('"content_hash": "%s", ' % h, ""))
    r = run(SNAP, "restore", target, str(snap))
    assert r.returncode == 0, r.stderr
    assert gmsfs.content_hash(target) == h


def test_copy_threads_bound_the_shards_and_a_bad_count_is_refused(store, tmp_path):
    """GMSFS_COPY_THREADS: a save with 3 threads writes 3 shards, restored by 1 thread to the
    same hash; 0, 17 or a word is refused with a message before anything is written."""
    want = snapshot_source(store)
    snap = tmp_path / "snap"
    env = dict(os.environ, GMSFS_COPY_THREADS="3")
    r = subprocess.run([SNAP, "save", "-q", store, str(snap)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((snap / "manifest.json").read_text())["shards"]) == 3
    other = empty_store(store, "one")
    env["GMSFS_COPY_THREADS"] = "1"
    r = subprocess.run([SNAP, "restore", "-q", other, str(snap)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and state(other)["layout_hash"] == want, r.stderr
    target = empty_store(store, "bad")
    for bad in ("0", "17", "many", "3x"):
        env["GMSFS_COPY_THREADS"] = bad
        r = subprocess.run([SNAP, "save", "-q", store, str(tmp_path / ("s" + bad))], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 1 and "GMSFS_COPY_THREADS=%s: not a count of threads from 1 to 16" % bad in r.stderr
        assert not (tmp_path / ("s" + bad) / "manifest.json").exists()
        r = subprocess.run([SNAP, "restore", "-q", target, str(snap)], capture_output=True, text=True, timeout=60,
                           env=env)
        refused_and_untouched(target, r, "GMSFS_COPY_THREADS=%s" % bad)


def test_a_save_over_an_old_snapshot_writes_what_a_fresh_one_would(store, tmp_path):
    """Saved again into a folder of an earlier save (written in place, not truncated): its
    shards byte for byte a fresh save's, though every old byte was garbage; fewer shards
    than before: the old ones past them removed."""
    want = snapshot_source(store)
    fresh, again = tmp_path / "fresh", tmp_path / "again"
    env = dict(os.environ, GMSFS_COPY_THREADS="4")
    for d in (fresh, again):
        r = subprocess.run([SNAP, "save", "-q", store, str(d)], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
    man = json.loads((again / "manifest.json").read_text())
    for sh in man["shards"]:  # every byte of the old save garbage, and longer than before
        (again / sh["file"]).write_bytes(b"\xff" * (sh["size"] + 100000))
    r = subprocess.run([SNAP, "save", "-q", store, str(again)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    for sh in man["shards"]:
        assert (again / sh["file"]).read_bytes() == (fresh / sh["file"]).read_bytes(), sh["file"]
    env["GMSFS_COPY_THREADS"] = "2"
    r = subprocess.run([SNAP, "save", "-q", store, str(again)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(again)) == ["manifest.json", "shard-000.bin", "shard-001.bin"]
    other = empty_store(store, "again")
    r = run(SNAP, "restore", other, str(again))
    assert r.returncode == 0 and state(other)["layout_hash"] == want, r.stderr


def test_a_save_again_needs_no_more_room_than_itself(store, tmp_path):
    """Saved in 2 shards on a small tmpfs, then again in 4 over them: the old shards are cut
    before the new bytes go in, so the second save fits where the larger of the two does
    (written in place and cut only at the end, it would need half as much again)."""
    want = snapshot_source(store)
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=27M", "tmpfs", str(fs)], check=True)
    try:
        snap = fs / "snap"
        for k in ("2", "4"):
            env = dict(os.environ, GMSFS_COPY_THREADS=k)
            r = subprocess.run([SNAP, "save", "-q", store, str(snap)], capture_output=True, text=True, timeout=60,
                               env=env)
            assert r.returncode == 0, (k, r.stderr)
        assert len(json.loads((snap / "manifest.json").read_text())["shards"]) == 4
        other = empty_store(store, "room")
        r = run(SNAP, "restore", other, str(snap))
        assert r.returncode == 0 and state(other)["layout_hash"] == want, r.stderr
    finally:
        subprocess.run(["umount", str(fs)], check=True)


def test_an_allocation_larger_than_a_shards_share_is_saved_in_parts(store, tmp_path):
    """One allocation of most of a store (gmsfs.torch.publish's one allocation of a model)
    goes into several shards, written at once, not through one writer: format 3, its
    "parts" in whole pieces; restored with the same bytes, layout hash and content hash;
    a byte changed in one part, or parts edited to other sizes, refused, nothing restored."""
    MiB = 1 << 20
    with gmsfs.connect(store, "rw") as c:
        big = c.create("model", 24 * MiB)
        c.buffer(big.ptr, big.size)[:] = bytes(range(251)) * (big.size // 251) + bytes(big.size % 251)
        for i in range(3):
            m = c.create("small/%d" % i, 4096 * (i + 1))
            c.buffer(m.ptr, m.size)[:] = bytes([i + 7]) * m.size
        c.commit()
        want = c.layout_hash
    content = gmsfs.digest(store, record=False)
    snap = tmp_path / "snap"
    env = dict(os.environ, GMSFS_COPY_THREADS="4")
    r = subprocess.run([SNAP, "save", "-q", store, str(snap)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    man = json.loads((snap / "manifest.json").read_text())
    model = next(a for a in man["allocations"] if a["name"] == "model")
    assert man["format"] == "gmsfs-snapshot 3" and len(man["shards"]) == 4 and "shard" not in model
    assert [p["size"] for p in model["parts"]] == [8 * MiB] * 3 and len({p["shard"] for p in model["parts"]}) == 3
    assert all("parts" not in a for a in man["allocations"] if a["name"] != "model")
    assert man["content_hash"] == content
    other = empty_store(store, "parts")
    r = run(SNAP, "save", "--version", "v1", store, str(tmp_path / "no"))  # a name is a restore's to give
    assert r.returncode == 2 and "usage" in r.stderr and not (tmp_path / "no").exists()
    r = run(SNAP, "restore", other, str(snap), "--version", "v1")
    assert r.returncode == 0 and gmsfs.committed_version(other) == "v1", r.stderr
    assert state(other)["layout_hash"] == want and gmsfs.content_hash(other) == content
    with gmsfs.connect(other, "ro") as c:
        m = c.import_one("model")
        assert bytes(c.buffer(m.ptr, m.size)) == bytes(range(251)) * (m.size // 251) + bytes(m.size % 251)
    target = empty_store(store, "t")
    second = model["parts"][1]
    shard = snap / man["shards"][second["shard"]]["file"]
    good = shard.read_bytes()
    with open(shard, "r+b") as f:
        f.seek(second["offset"] + 3 * MiB + 5)
        f.write(b"\xff\x00")
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)),
                          "its shards: the bytes of allocs/model differ from the saved ones")
    shard.write_bytes(good)
    text = (snap / "manifest.json").read_text()
    first = '"size": %d}' % (8 * MiB)
    for old_, new_, words in ((first, '"size": %d}' % (8 * MiB - 4096), "whole pieces"),  # not whole pieces
                              ('"size": %d, "parts"' % (24 * MiB), '"size": %d, "parts"' % (24 * MiB + 4096),
                               "its parts are %d bytes, not its %d" % (24 * MiB, 24 * MiB + 4096)),
                              ('"gmsfs-snapshot 3"', '"gmsfs-snapshot 2"', "is not {name, tag, size, shard")):
        assert old_ in text, old_
        (snap / "manifest.json").write_text(text.replace(old_, new_, 1))
        refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), words)


def test_a_snapshot_that_differs_is_refused_and_restores_nothing(store, tmp_path):
    """A changed byte, a shard cut short, a manifest missing or mangled: each refused with
    what is wrong, the target store as it was (no session left, nothing committed)."""
    snapshot_source(store)
    snap = tmp_path / "snap"
    assert run(SNAP, "save", store, str(snap)).returncode == 0
    man = json.loads((snap / "manifest.json").read_text())
    victim = next(a for a in man["allocations"] if a["name"] == "many/3")
    shard = snap / man["shards"][victim["shard"]]["file"]
    good = shard.read_bytes()
    target = empty_store(store, "t")
    with open(shard, "r+b") as f:  # four bytes in the middle of many/3
        f.seek(victim["offset"] + 1001)
        f.write(b"\xde\xad\xbe\xef")
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)),
                          "the bytes of allocs/many/3 differ from the saved ones")
    shard.write_bytes(good[:-4096])  # cut short
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "not the %d the manifest says" % len(good))
    shard.write_bytes(good)
    text = (snap / "manifest.json").read_text()
    (snap / "manifest.json").write_text(text.replace('"value": "00ff10"', '"value": "0g"'))
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "not hex")
    (snap / "manifest.json").write_text(text.replace('"shard": %d, "offset": %d' % (victim["shard"], victim["offset"]),
                                                     '"shard": %d, "offset": %d' % (victim["shard"], len(good))))
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "lies outside its shard")
    # Edited by one hex digit or one letter where every field still parses: an entry's value,
    # a tag, a key, the layout hash itself.  Refused before the commit (it was committed,
    # then refused, before), the target as it was.
    edits = [('"value": "00ff10"', '"value": "00ff11"'), ('"tag": "%s"' % victim["tag"], '"tag": "%sx"' % victim["tag"]),
             ('"key": "', '"key": "x'), ('"layout_hash": "%s' % man["layout_hash"][:31],
                                         '"layout_hash": "%s' % man["layout_hash"][:30] +
                                         ("0" if man["layout_hash"][30] != "0" else "1"))]
    for old_, new_ in edits:
        assert old_ in text, old_
        (snap / "manifest.json").write_text(text.replace(old_, new_, 1))
        refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "edited or damaged, nothing restored")
    (snap / "manifest.json").unlink()
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "a save that did not finish leaves none")
    (snap / "layout.json").write_text("{}")  # what format 1 wrote
    refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "format 1")
    (snap / "manifest.json").write_text(text)
    r = run(SNAP, "restore", target, str(snap))  # whole again: it restores
    assert r.returncode == 0, r.stderr


def test_a_save_that_fails_leaves_no_manifest(store, tmp_path):
    """The manifest is written last, and an old one goes first: a save that stops midway
    (here: a file system that fills) leaves nothing to restore from."""
    snapshot_source(store)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        snap = small / "snap"
        snap.mkdir()
        (snap / "manifest.json").write_text("an old save's")
        r = run(SNAP, "save", store, str(snap))
        assert r.returncode == 1 and "No space left on device" in r.stderr, r.stderr
        assert not (snap / "manifest.json").exists()
        target = empty_store(store, "t")
        refused_and_untouched(target, run(SNAP, "restore", target, str(snap)), "a save that did not finish")
    finally:
        subprocess.run(["umount", str(small)], check=True)


class Rotary(torch.nn.Module):
    """A transformers-style rotary embedding: a non-persistent buffer no checkpoint holds."""

    def __init__(self, device=None):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2, device=device).float() / 8)),
                             persistent=False)


class Llamaish(torch.nn.Module):
    """A checkpoint's model as transformers builds it: tied head, rotary buffer, _init_weights."""

    def __init__(self, device=None, hidden=8):
        super().__init__()
        self.embed = torch.nn.Embedding(16, hidden, device=device)
        self.proj = torch.nn.Linear(hidden, hidden, bias=False, device=device)
        self.head = torch.nn.Linear(hidden, 16, bias=False, device=device)
        self.head.weight = self.embed.weight
        self.rotary = Rotary(device)

    def _init_weights(self, module):  # what transformers' PreTrainedModel has
        if isinstance(module, Rotary):
            module.inv_freq.copy_(Rotary().inv_freq)


def llamaish_checkpoint(tmp_path, hidden=8):
    r = np.random.default_rng(1)
    f = tmp_path / "model.safetensors"
    write_st(f, {"embed.weight": ("F32", r.standard_normal((16, hidden)).astype(np.float32)),
                 "proj.weight": ("F32", r.standard_normal((hidden, hidden)).astype(np.float32))})
    return f


def test_a_checkpoint_materializes_as_transformers_builds_models(store, tmp_path):
    """Non-persistent buffers (not in the checkpoint) are made by the model's own code on
    the store's device; a tied name the checkpoint lacks follows its twin."""
    f = llamaish_checkpoint(tmp_path)
    assert run(LOAD, "-q", store, str(f)).returncode == 0
    m = gt.materialize(Llamaish(device="meta"), store)
    assert m.rotary.inv_freq.device.type == "cpu"
    assert torch.equal(m.rotary.inv_freq, Rotary().inv_freq)
    assert m.head.weight is m.embed.weight
    for n, shape in (("embed.weight", (16, 8)), ("proj.weight", (8, 8))):
        want = np.frombuffer(read_st(f)[n][2], np.float32).reshape(shape)
        assert np.array_equal(dict(m.named_parameters())[n].numpy(), want), n
    m._gmsfs.close()


def test_a_module_that_cannot_make_its_buffers_is_told_what_to_call_and_left_alone(store, tmp_path):
    f = llamaish_checkpoint(tmp_path)
    assert run(LOAD, "-q", store, str(f)).returncode == 0

    class NoInit(Llamaish):
        _init_weights = None
    m = NoInit(device="meta")
    with pytest.raises(RuntimeError, match=r"lacks the non-persistent buffers \['rotary.inv_freq'\].*init="):
        gt.materialize(m, store)
    assert m.proj.weight.device.type == "meta", "refused before the module was touched"
    made = []
    gt.materialize(m, store, init=lambda owner: (made.append(owner), owner.inv_freq.copy_(Rotary().inv_freq)))
    assert made == [m.rotary] and torch.equal(m.rotary.inv_freq, Rotary().inv_freq)
    m._gmsfs.close()


def test_buffers_the_module_code_leaves_unset_are_refused(store, tmp_path):
    assert run(LOAD, "-q", store, str(llamaish_checkpoint(tmp_path))).returncode == 0
    calls = []
    m = Llamaish(device="meta")
    with pytest.raises(RuntimeError, match=r"\['rotary.inv_freq'\] were left unset"):
        gt.materialize(m, store, init=calls.append)
    assert len(calls) == 1, "an init that raises nothing runs once"
    assert all(t.device.type == "meta" for t in list(m.parameters()) + list(m.buffers())), "the module is as it was"


def test_an_init_that_replaces_its_buffers_is_taken(store, tmp_path):
    """A buffer counts as set when init writes to it (in place, even partly) or replaces it."""
    assert run(LOAD, "-q", store, str(llamaish_checkpoint(tmp_path))).returncode == 0

    def replace(owner):
        owner.inv_freq = Rotary().inv_freq * 2
    m = gt.materialize(Llamaish(device="meta"), store, init=replace)
    assert torch.equal(m.rotary.inv_freq, Rotary().inv_freq * 2)
    m._gmsfs.close()
    m = gt.materialize(Llamaish(device="meta"), store, init=lambda owner: owner.inv_freq[1:].fill_(3))
    assert torch.equal(m.rotary.inv_freq[1:], torch.full((3,), 3.0))
    m._gmsfs.close()


def test_an_init_that_fails_off_the_device_runs_again_on_it(store, tmp_path):
    """Buffers are made on the CPU first (no GPU kernel); module code that needs the
    store's device (its other tensors are there) fails there and runs again on it."""
    assert run(LOAD, "-q", store, str(llamaish_checkpoint(tmp_path))).returncode == 0
    tries = []

    def init(owner):
        tries.append(owner.inv_freq.device)
        if len(tries) == 1:
            raise RuntimeError("Expected all tensors to be on the same device")
        owner.inv_freq.copy_(Rotary().inv_freq)
    m = gt.materialize(Llamaish(device="meta"), store, init=init)
    assert len(tries) == 2 and torch.equal(m.rotary.inv_freq, Rotary().inv_freq)
    m._gmsfs.close()


def test_stored_buffers_are_viewed_unless_the_module_makes_its_own(store):
    """A store that holds the non-persistent buffers (publish stores every buffer) gives
    them as views; own_buffers=True has the module's code make them all the same (what
    gmsfs.transformers does for a reader whose config differs from the publisher's)."""
    src = Llamaish()
    src.rotary.inv_freq *= 5
    gt.publish(src, store).close()
    m = gt.materialize(Llamaish(device="meta"), store)
    assert torch.equal(m.rotary.inv_freq, Rotary().inv_freq * 5) and m._gmsfs.find_ptr(m.rotary.inv_freq.data_ptr())
    m._gmsfs.close()
    m = gt.materialize(Llamaish(device="meta"), store, own_buffers=True)
    assert torch.equal(m.rotary.inv_freq, Rotary().inv_freq) and not m._gmsfs.find_ptr(m.rotary.inv_freq.data_ptr())
    assert m._gmsfs.find_ptr(m.proj.weight.data_ptr()), "the rest are views all the same"
    m._gmsfs.close()


class RopeLlamaish(Llamaish):
    """Llamaish whose rotary buffer follows its config's theta (transformers' rope_theta)."""

    def __init__(self, theta, device=None):
        super().__init__(device)
        self.theta = theta

    def _init_weights(self, module):
        if isinstance(module, Rotary):
            module.inv_freq.copy_(1.0 / (self.theta ** (torch.arange(0, 8, 2).float() / 8)))


def test_transformers_readers_view_the_loaders_buffers_when_their_recipe_is_the_same(store, tmp_path, monkeypatch):
    """gmsfs.transformers.from_pretrained: the process that loads stores the model's
    non-persistent buffers and their recipe; a reader with the same recipe views them, one
    with other config overrides makes its own.  (transformers itself is stood in for: the
    host has none; the GPU bench runs the real one.)"""
    import sys
    import types
    import gmsfs.transformers as gtf
    folder = tmp_path / "ckpt"
    folder.mkdir()
    llamaish_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps({"theta": 10000.0}))
    fake = types.ModuleType("transformers")
    fake.__version__ = "5.0.0"

    class AutoConfig:
        @staticmethod
        def from_pretrained(path, **kw):
            c = types.SimpleNamespace(**json.loads((folder / "config.json").read_text()))
            c.__dict__.update(kw)
            return c
    fake.AutoConfig = AutoConfig
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr(gtf, "build_meta", lambda config, model_class=None, dtype=None:
                        RopeLlamaish(config.theta, device="meta"))
    loader = gtf.from_pretrained(store, str(folder))
    assert loader._gmsfs_published and torch.equal(loader.rotary.inv_freq, Rotary().inv_freq)
    with gmsfs.connect(store, "ro") as c:
        assert c.meta_get(gtf.RECIPE).value == gtf.recipe(str(folder), loader).encode()
        assert c.meta_get("torch/rotary.inv_freq").size == 16, "the loader stored its buffer"
    same = gtf.from_pretrained(store, str(folder))
    assert not same._gmsfs_published and torch.equal(same.rotary.inv_freq, Rotary().inv_freq)
    assert same._gmsfs.find_ptr(same.rotary.inv_freq.data_ptr()), "viewed, not made again"
    other = gtf.from_pretrained(store, str(folder), theta=500.0)
    assert not other._gmsfs.find_ptr(other.rotary.inv_freq.data_ptr()), "another recipe: its own"
    assert torch.allclose(other.rotary.inv_freq, 1.0 / (500.0 ** (torch.arange(0, 8, 2).float() / 8)))
    assert other._gmsfs.find_ptr(other.proj.weight.data_ptr())
    # By its bytes: the content hash asked for is given; other bytes are refused.
    h = gmsfs.digest(store)
    by_hash = gtf.from_pretrained(store, str(folder), expect=h)
    assert not by_hash._gmsfs_published and torch.equal(by_hash.proj.weight, loader.proj.weight)
    with pytest.raises(gmsfs.GmsfsError) as e:
        gtf.from_pretrained(store, str(folder), expect="0" * 32)
    assert e.value.errno == errno.EIO
    # The checkpoint rewritten in place (the same shapes): the store's weights are not its.
    files = gmsfs._load._checkpoint_files(str(folder))
    st = os.stat(files[0])
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(gmsfs.GmsfsError) as e:
        gtf.from_pretrained(store, str(folder))
    assert e.value.errno == errno.ESTALE and "holds other weights than" in str(e.value)
    assert "mtime_ns was %d when it was loaded" % st.st_mtime_ns in str(e.value)
    for m in (loader, same, other, by_hash):
        m._gmsfs.close()
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns))  # the files as loaded; the store committed again
    assert gtf.from_pretrained(store, str(folder))._gmsfs.close() is None
    with gmsfs.connect(store, "data") as w:
        w.commit()
    with pytest.raises(gmsfs.GmsfsError) as e:
        gtf.from_pretrained(store, str(folder))
    assert e.value.errno == errno.ESTALE and "committed again since" in str(e.value)


def test_shapes_and_dtypes_are_checked_before_the_module_is_touched(store, tmp_path):
    f = llamaish_checkpoint(tmp_path, hidden=4)
    assert run(LOAD, "-q", store, str(f)).returncode == 0
    m = Llamaish(device="meta", hidden=8)
    with pytest.raises(RuntimeError) as e:
        gt.materialize(m, store)
    msg = str(e.value)
    assert "size mismatch for embed.weight: the store has shape [16, 4], the module has shape [16, 8]" in msg
    assert "size mismatch for proj.weight: the store has shape [4, 4], the module has shape [8, 8]" in msg
    assert all(p.device.type == "meta" for p in m.parameters()), "the module is as it was"
    m = Llamaish(device="meta", hidden=4).to(torch.float64)
    with pytest.raises(RuntimeError, match="dtype mismatch for embed.weight: the store has float32, the module "
                                           "has float64"):
        gt.materialize(m, store)


def test_load_in_this_process_at_gmsfs_loads_speed_then_commit(store, tmp_path):
    """gmsfs.load: what gmsfs-load does, inside the writer's own session (no second process
    could join it); nothing stays without a commit."""
    f = tmp_path / "model.safetensors"
    write_st(f, model_tensors(3))
    with gmsfs.connect(store, "rw") as c:
        gmsfs.load(c, f)
        assert state(store)["state"] == "RW"
    assert state(store)["state"] == "EMPTY", "closed without commit: nothing stays"
    with gmsfs.connect(store, "rw") as c:
        with pytest.raises(gmsfs.GmsfsError, match="data_offsets outside the file's data"):
            bad = tmp_path / "bad.safetensors"
            write_st(bad, model_tensors(3), raw=lambda d: d[:-5])
            gmsfs.load(c, bad)
        assert gmsfs.load(c, f) is True
        c.commit()
    m = gt.materialize(Model(), store)
    for name, (dt, a) in model_tensors(3).items():
        got = dict(m.named_parameters(), **dict(m.named_buffers()))[name]
        assert np.array_equal(got.numpy(), a), name
    m._gmsfs.close()
    with gmsfs.connect(store, "rw") as c:  # held already: nothing done, nothing to commit
        assert gmsfs.load(c, f) is False
        other = tmp_path / "other.safetensors"
        write_st(other, model_tensors(4))
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.load(c, other)
        assert e.value.errno == errno.EEXIST and "of another checkpoint" in str(e.value)
        assert gmsfs.load(c, other, replace=True) is True
        c.commit()
    assert state(store)["generation"] == "2"
    m = gt.materialize(Model(), store)
    assert np.array_equal(m.embed.weight.detach().numpy(), model_tensors(4)["embed.weight"][1])
    m._gmsfs.close()


def test_gmsfs_load_checks_its_options_and_says_why_in_the_handles_words(store, tmp_path):
    """The C call: a wrong options size, an unknown flag, a slab below GMSFS_TORCH_ALIGN or a
    reader's handle is refused with words in gmsfs_errmsg(handle); NULL options are the
    defaults."""
    from gmsfs import _lib
    lib = _lib.load_lib()
    f = tmp_path / "model.safetensors"
    write_st(f, model_tensors(3))

    def load(c, opt):
        e = lib.gmsfs_load(c._handle(), str(f).encode(), opt and ctypes.byref(opt))
        return errno.errorcode.get(-e, e), _lib.side_errmsg(lib, c._handle())

    with gmsfs.connect(store, "rw") as c:
        bad = _lib.sized(_lib.LoadOptions)
        bad.size = 4
        assert load(c, bad) == ("EINVAL", "gmsfs_load: options of 4 bytes: this libgmsfs-load knows 16 (set .size, "
                                "or start from GMSFS_LOAD_OPTIONS)")
        assert load(c, _lib.sized(_lib.LoadOptions, flags=32))[1].startswith("gmsfs_load: no path, or flags 0x20")
        assert load(c, _lib.sized(_lib.LoadOptions, slab_bytes=100))[1].startswith("gmsfs_load: slabs of 100 bytes")
        assert state(store)["allocations"] == "0"
        assert load(c, None) == (0, "")
        c.commit()
    with gmsfs.connect(store, "ro") as c:
        assert load(c, None) == ("EPERM", "gmsfs_load: the handle does not hold the writer session")


def gms_snapshot(path, allocations, metadata, layout_hash="0" * 64):
    """A snapshot as GMS's gms-storage-client writes one: manifest.json (version 1.0),
    shards/shard_NNNN.bin (the aligned bytes back to back), gms_metadata.json (values in
    base64).  allocations: [(allocation id, tag, bytes)]; metadata: {key: (id, offset, value)}."""
    import base64
    (path / "shards").mkdir(parents=True)
    entries, blob = [], b""
    for aid, tag, data in allocations:
        aligned = -(-len(data) // (2 << 20)) * (2 << 20)
        entries.append({"allocation_id": aid, "size": len(data), "aligned_size": aligned, "tag": tag,
                        "tensor_file": "shards/shard_0000.bin", "tensor_offset": len(blob)})
        blob += data + bytes(aligned - len(data))
    (path / "shards" / "shard_0000.bin").write_bytes(blob)
    (path / "gms_metadata.json").write_text(json.dumps(
        {k: {"allocation_id": a, "offset_bytes": o, "value": base64.b64encode(v).decode()} for k, (a, o, v) in
         metadata.items()}, indent=2))
    (path / "manifest.json").write_text(json.dumps({"version": "1.0", "timestamp": 1.5, "layout_hash": layout_hash,
                                                    "device": 0, "allocations": entries}, indent=2))


def test_a_gms_snapshot_restores_as_gmsfs_gms_would_have_written_it(store, tmp_path):
    """GMS's format in: allocations become layout slots in the manifest's order, keys that
    are no path are %-escaped as gmsfs.gms escapes them, values decoded; GMS clients
    (gmsfs.gms) then read it as they would the server they saved."""
    from gmsfs._gms_common import _key_path
    ids = ["6f1e-aa", "0c2d-bb", "99ff-cc"]
    gms_snapshot(tmp_path / "gms", [(ids[0], "weights", b"\x01" * 5000), (ids[1], "weights", b"\x02" * (3 << 20)),
                                    (ids[2], "kv", b"\x03")],
                 {"model.embed.weight": (ids[0], 0, b'{"shape": [10]}'), "a key/with//slashes": (ids[1], 64, b"x"),
                  "%odd": (ids[1], 0, b"\x00\xff")})
    r = run(SNAP, "restore", store, str(tmp_path / "gms"))
    assert r.returncode == 0, r.stderr
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        assert sorted((m.name, m.tag, m.size) for m in c.mappings) == [
            ("slot000000", "weights", 5000), ("slot000001", "weights", 3 << 20), ("slot000002", "kv", 1)]
        assert bytes(c.buffer(c.find("slot000001").ptr, 4)) == b"\x02" * 4
        e = c.meta_get("model.embed.weight")
        assert (e.alloc, e.offset, e.value) == ("slot000000", 0, b'{"shape": [10]}')
        for k, (aid, off, val) in {"a key/with//slashes": (ids[1], 64, b"x"), "%odd": (ids[1], 0, b"\x00\xff")}.items():
            e = c.meta_get(_key_path(k))
            assert (e.alloc, e.offset, e.value) == ("slot000001", off, val)


def test_gms_format_out_and_back_keeps_the_layout_hash(store, tmp_path):
    """gmsfs's format for GMS (save --gms): GMS's files and fields, the gmsfs keys, extents
    and flags beside them, so a gmsfs store comes back with the same hash; a GMS snapshot
    that is short or names an allocation it lacks is refused and restores nothing."""
    want = snapshot_source(store)
    out = tmp_path / "out"
    r = run(SNAP, "save", "--gms", store, str(out))
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["version"] == "1.0" and man["layout_hash"] == want and man["gmsfs"] == 1
    a = {x["allocation_id"]: x for x in man["allocations"]}
    assert a["layers/0/w"]["size"] == 10000 and a["layers/0/w"]["aligned_size"] % 4096 == 0
    meta = json.loads((out / "gms_metadata.json").read_text())
    assert meta["scale"]["allocation_id"] == "kv" and meta["scale"]["value"] == "AP8Q"
    other = empty_store(store, "back")
    r = run(SNAP, "restore", other, str(out))
    assert r.returncode == 0, r.stderr
    assert state(other)["layout_hash"] == want
    shard = out / "shards" / "shard_0000.bin"
    shard.write_bytes(shard.read_bytes()[:100])
    third = empty_store(store, "short")
    refused_and_untouched(third, run(SNAP, "restore", third, str(out)), "too short")
    bad = tmp_path / "bad"
    gms_snapshot(bad, [("x", "w", b"1")], {"k": ("nobody", 0, b"")})
    refused_and_untouched(third, run(SNAP, "restore", third, str(bad)), "which the manifest lacks")
