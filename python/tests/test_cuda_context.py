"""gmsfs._cuda: before a connect, the primary context of the store's GPU is made current
in a thread that has none.  With a stand-in driver here (the host has no libcuda); the
real driver is met on the GPU machine (tests/gpu/run.sh: a fresh process with no context
imports a GPU store; GMS's tests through gmsfs.gms)."""
import ctypes

import pytest

import gmsfs._cuda as cuda

GPU0 = "GPU-6c78bd80-cf57-c6ce-bc6e-5433b17443bf"
GPU1 = "GPU-0123abcd-4567-89ab-cdef-0123456789ab"


class Driver:
    """libcuda's calls that make_current makes, over a list of device uuids."""

    def __init__(self, uuids, current=None):
        self.uuids, self.current, self.calls = uuids, current, []

    def cuCtxGetCurrent(self, p):
        p._obj.value = self.current
        return 0

    def cuDeviceGetCount(self, p):
        p._obj.value = len(self.uuids)
        return 0

    def cuDeviceGet(self, p, i):
        p._obj.value = i
        return 0

    def cuDeviceGetUuid_v2(self, raw, dev):
        ctypes.memmove(raw, bytes.fromhex(self.uuids[dev.value][4:].replace("-", "")), 16)
        return 0

    def cuDevicePrimaryCtxRetain(self, p, dev):
        self.calls.append(("retain", dev.value))
        p._obj.value = 0x1000 + dev.value
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("current", ctx.value))
        self.current = ctx.value
        return 0


def mount(tmp_path, backend, uuid):
    (tmp_path / "device").write_text("backend: %s\nindex: 0\nuuid: %s\n" % (backend, uuid))
    return str(tmp_path / "llama")


def test_the_store_gpu_primary_context_made_current(tmp_path, monkeypatch):
    d = Driver([GPU0, GPU1])
    monkeypatch.setattr(cuda, "_cu", d)
    cuda.make_current(mount(tmp_path, "cuda", GPU1))
    assert d.calls == [("retain", 1), ("current", 0x1001)]
    cuda.make_current(mount(tmp_path, "cuda", GPU1))  # now current: nothing more
    assert len(d.calls) == 2


def test_a_current_context_is_left_alone(tmp_path, monkeypatch):
    d = Driver([GPU0, GPU1], current=0x42)
    monkeypatch.setattr(cuda, "_cu", d)
    cuda.make_current(mount(tmp_path, "cuda", GPU1))
    assert d.calls == [] and d.current == 0x42


@pytest.mark.parametrize("backend,uuid", [("host", GPU0), ("cuda", "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")])
def test_nothing_for_the_host_backend_or_a_gpu_not_seen(tmp_path, monkeypatch, backend, uuid):
    d = Driver([GPU0])
    monkeypatch.setattr(cuda, "_cu", d)
    cuda.make_current(mount(tmp_path, backend, uuid))
    assert d.calls == []


def test_no_driver_no_device_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "_cu", False)
    cuda.make_current(str(tmp_path / "nowhere" / "s"))  # nothing loaded, nothing read
    d = Driver([GPU0])
    monkeypatch.setattr(cuda, "_cu", d)
    cuda.make_current(str(tmp_path / "nowhere" / "s"))  # no device file: left to connect
    assert d.calls == []


def test_uuid_text():
    assert cuda._uuid(bytes.fromhex(GPU0[4:].replace("-", ""))) == GPU0
