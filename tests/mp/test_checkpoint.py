"""Checkpoints: lib <-> lib, NumPy <-> lib, inside real MicroPython; damage, wrong models, crashes."""
import os
import re
import random
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import helpers
import microformer as mf
from microformer import checkpoint as ck
from microformer.spec import to_spec
import checkpoint_np
from checkpoint_mp import build
import checkpoint_kill_mp
import checkpoint_states_mp



def nospec(meta):
    """meta without the 'spec' that checkpoint.save adds."""
    return {k: meta[k] for k in meta if k != "spec"}

def snapshot(model):
    return [(n, p.shape, bytes(p.data)) for n, p in model.named_params()]


@pytest.fixture
def saved(tmp_path):
    m = build(3)
    path = str(tmp_path / "m.mfck")
    size = ck.save(path, m, {"classes": ["setosa", "versicolor", "virginica"], "mean": [5.8, 3.05],
                             "epoch": 7})
    assert os.path.getsize(path) == size
    assert not os.path.exists(path + ".tmp")
    return path, m


# ---- round trips --------------------------------------------------------------------------

def test_roundtrip_cpython_bit_identical(saved):
    path, m = saved
    other = build(9)
    assert snapshot(other) != snapshot(m)
    meta = ck.load(path, other)
    assert meta["spec"] == to_spec(m)          # save() adds the model's spec to the caller's meta
    assert {k: v for k, v in meta.items() if k != "spec"} == \
        {"classes": ["setosa", "versicolor", "virginica"], "mean": [5.8, 3.05], "epoch": 7}
    assert snapshot(other) == snapshot(m)
    got_meta, tensors = ck.read(path)
    assert got_meta == meta
    assert [(n, s, bytes(a)) for n, s, a in tensors] == snapshot(m)
    text = ck.info(path, show=False)
    assert "3.Wq" in text and "4x4" in text and "Attention" in text


def test_crc_fallback_matches_zlib():
    rng = random.Random(1)
    for n in (0, 1, 3, 255, 1000):
        b = bytes(rng.randrange(256) for _ in range(n))
        assert ck.crc32_py(b) == zlib.crc32(b)
        assert ck.crc32_py(b[n // 2:], ck.crc32_py(b[:n // 2])) == zlib.crc32(b)
    from array import array
    a = array("f", [1.5, -2.0, float("inf")])
    assert ck.crc32(a) == zlib.crc32(bytes(a))


def special_tensors(model, seed=0, finite=False):
    """float32 bit patterns from NumPy, including -0, denormals, inf and NaN payloads
    (finite=True: -0, denormals and the extremes only: save() refuses inf and NaN)."""
    r = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_params():
        a = r.standard_normal(p.shape).astype("<f4")
        flat = a.reshape(-1)
        bits = ([0x80000000, 0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x807FFFFF] if finite else
                [0x80000000, 0x00000001, 0x7F800000, 0xFF800000, 0x7FC12345, 0x7F800001])
        specials = np.array(bits, dtype="<u4").view("<f4")
        k = min(len(flat), len(specials))
        flat[:k] = specials[:k]
        out[name] = a
    return out


def test_numpy_write_lib_load(tmp_path):
    m = build(3)
    tensors = special_tensors(m, finite=True)
    path = str(tmp_path / "np.mfck")
    checkpoint_np.write(path, tensors, ck.model_tag(m), {"from": "numpy"})
    assert nospec(ck.load(path, m)) == {"from": "numpy"}
    for name, p in m.named_params():
        assert bytes(p.data) == tensors[name].tobytes(), name
    # inf and NaN payloads: refused on load as on save, naming the tensor; the model unchanged
    bad = str(tmp_path / "bad.mfck")
    checkpoint_np.write(bad, special_tensors(m), ck.model_tag(m), {"from": "numpy"})
    first = m.named_params()[0][0]
    with pytest.raises(ck.CheckpointError, match="bad.mfck.*tensor '%s' holds inf at index 2" % re.escape(first)):
        ck.load(bad, m)
    for name, p in m.named_params():
        assert bytes(p.data) == tensors[name].tobytes(), name


def test_lib_save_numpy_read(saved):
    path, m = saved
    tag, meta, tensors = checkpoint_np.read(path)
    assert tag == ck.model_tag(m)
    assert meta["epoch"] == 7
    assert list(tensors) == [n for n, _ in m.named_params()]
    for name, p in m.named_params():
        assert tensors[name].shape == p.shape
        assert tensors[name].tobytes() == bytes(p.data)


def test_numpy_cli(saved):
    path, m = saved
    out = subprocess.run([sys.executable, os.path.join(helpers.ORACLES, "checkpoint_np.py"), "info", path],
                         capture_output=True, text=True, check=True).stdout
    assert "3.Wq" in out and "%d tensors" % len(m.named_params()) in out


def test_micropython_roundtrip_bit_identical(tmp_path, micropython):
    m = build(3)
    tensors = special_tensors(m, seed=5, finite=True)     # MicroPython saves them again
    checkpoint_np.write(str(tmp_path / "np.mfck"), tensors, ck.model_tag(m), {"from": "numpy"})
    out = helpers.run_micropython(helpers.script("checkpoint_mp.py"), tmp_path, exe=micropython)
    assert "meta numpy" in out and "fallback ok" in out
    lines = dict(l.split(" ", 1) for l in out.splitlines())
    size = os.path.getsize(tmp_path / "mp_copy.mfck")
    # every damaged copy tried (a cut and a bit flip every 7 bytes) was refused
    assert int(lines["refused"]) == 2 * len(range(0, size, 7)), (lines, size)
    assert int(lines["crashes"]) > 0
    for fname in ("mp_copy.mfck", "mp_fallback.mfck"):
        tag, meta, got = checkpoint_np.read(str(tmp_path / fname))
        assert meta.pop("spec") == to_spec(m)      # written by MicroPython's save(): the same spec
        assert meta == {"by": "micropython"} and tag == ck.model_tag(m)
        for name in tensors:
            assert got[name].tobytes() == tensors[name].tobytes(), (fname, name)
    # the seeded model built and saved by MicroPython equals the CPython one, bit for bit
    other = build(1)
    assert ck.load(str(tmp_path / "mp_seed3.mfck"), other) == {"epoch": 7, "spec": to_spec(other)}
    assert snapshot(other) == snapshot(m)


# ---- damage ---------------------------------------------------------------------------------

def _refuse(path, model, data, match):
    with open(path, "wb") as f:
        f.write(data)
    before = snapshot(model)
    with pytest.raises(ValueError) as e:
        ck.load(path, model)
    assert snapshot(model) == before, "a refused load changed the model"
    assert match in str(e.value), str(e.value)
    return str(e.value)


def test_truncated_at_every_offset(saved, tmp_path):
    path, _ = saved
    data = open(path, "rb").read()
    m = build(9)
    bad = str(tmp_path / "cut.mfck")
    for off in range(len(data)):
        msg = _refuse(bad, m, data[:off], "truncated")
        if off >= 16:
            assert "expected %d bytes, got %d" % (len(data), off) in msg
    _refuse(bad, m, data + b"\0", "unexpected bytes after the end")


def test_bit_flip_at_every_offset(saved, tmp_path):
    path, _ = saved
    data = open(path, "rb").read()
    m = build(9)
    bad = str(tmp_path / "flip.mfck")
    for off in range(len(data)):
        for bit in (off % 8, 7 - off % 8):
            flipped = data[:off] + bytes([data[off] ^ (1 << bit)]) + data[off + 1:]
            match = "not a microformer checkpoint" if off < 4 else "corrupt header" if off < 16 else "bad CRC"
            _refuse(bad, m, flipped, match)


def test_not_a_checkpoint_and_version(tmp_path, saved):
    path, _ = saved
    m = build(9)
    bad = str(tmp_path / "x.mfck")
    _refuse(bad, m, b"hello world, this is not a checkpoint", "not a microformer checkpoint")
    data = bytearray(open(path, "rb").read())
    data[4:6] = struct.pack("<H", 3)
    data[12:16] = struct.pack("<I", zlib.crc32(bytes(data[:12])))
    _refuse(bad, m, bytes(data), "unsupported version 3 (this reader knows versions 1 and 2)")


def test_wrong_model_and_wrong_shape(saved, tmp_path):
    path, m = saved
    bigger = build(3, E=8, hidden=32)
    msg = _refuse_file(path, bigger)      # the file carries its spec: the first difference is named
    assert "wrong model: the checkpoint's spec differs from this model's (spec.layers[0].out_features: " \
        "16 in the checkpoint, 32 in the model)" in msg, msg
    nospec = str(tmp_path / "nospec.mfck")  # a file without a spec: the shapes still decide
    ck.save(nospec, m, spec=False)
    msg = _refuse_file(nospec, bigger)
    assert "wrong shape: 0.W: expected (32, 4), got (16, 4)" in msg, msg
    mf.seed(1)
    plain = mf.Sequential([mf.Dense(4, 8), mf.ActivationLayer("relu"), mf.Dense(8, 3)])
    assert "wrong model" in _refuse_file(path, plain)
    # same tag, a tensor missing / an extra one
    tensors = {n: np.frombuffer(b, "<f4").reshape(s) for n, s, b in snapshot(m)}
    tag = ck.model_tag(m)
    short = dict(tensors)
    del short["3.bk"]
    p2 = str(tmp_path / "short.mfck")
    checkpoint_np.write(p2, short, tag, {})
    assert "wrong model: checkpoint has no tensor '3.bk'" in _refuse_file(p2, build(9))
    extra = dict(tensors)
    extra["6.W"] = np.ones((2, 2), np.float32)
    checkpoint_np.write(p2, extra, tag, {})
    assert "wrong model: checkpoint has tensor '6.W' the model lacks" in _refuse_file(p2, build(9))
    # shape message in the brief's form
    bad = dict(tensors)
    bad["3.Wq"] = np.zeros((2, 2), np.float32)
    checkpoint_np.write(p2, bad, tag, {})
    assert "3.Wq: expected (4, 4), got (2, 2)" in _refuse_file(p2, build(9))
    # an explicit tag must match too
    with pytest.raises(ValueError, match="wrong model"):
        ck.load(path, build(9), tag="iris-v2")


def _refuse_file(path, model):
    before = snapshot(model)
    with pytest.raises(ValueError) as e:
        ck.load(path, model)
    assert snapshot(model) == before
    return str(e.value)


# ---- interrupted saves --------------------------------------------------------------------------

class _Crash(Exception):
    pass


def _dying_open(limit):
    """open() whose file takes `limit` bytes, puts them on disk, then 'loses power'."""
    def opener(p, mode):
        f = open(p, mode)

        class Dying:
            left = limit

            def write(self, b):
                b = memoryview(b).cast("B")
                if len(b) > self.left:
                    f.write(b[:self.left])
                    f.close()
                    raise _Crash()
                self.left -= len(b)
                return f.write(b)

            def flush(self):
                f.flush()

            def fileno(self):
                return f.fileno()

            def close(self):
                f.close()
        return Dying()
    return opener


def test_interrupted_save_at_every_offset(tmp_path, monkeypatch):
    path = str(tmp_path / "live.mfck")
    old, new = build(3), build(4)
    size = ck.save(path, old, {"v": "old"})
    for limit in range(size):           # limit == size: the whole tmp, covered below
        monkeypatch.setattr(ck, "_open", _dying_open(limit))
        with pytest.raises(_Crash):
            ck.save(path, new, {"v": "new"})
        monkeypatch.setattr(ck, "_open", open)
        m = build(9)
        assert nospec(ck.load(path, m)) == {"v": "old"}, limit
        assert snapshot(m) == snapshot(old)
    # the crash lands between the complete tmp and the rename
    monkeypatch.setattr(ck.os, "replace", lambda a, b: (_ for _ in ()).throw(_Crash()))
    with pytest.raises(_Crash):
        ck.save(path, new, {"v": "new"})
    monkeypatch.undo()
    assert os.path.getsize(path + ".tmp") == size
    m = build(9)
    assert nospec(ck.load(path, m)) == {"v": "old"}
    # the next save overwrites the stale tmp
    ck.save(path, new, {"v": "new"})
    assert nospec(ck.load(path, m)) == {"v": "new"} and snapshot(m) == snapshot(new)
    assert not os.path.exists(path + ".tmp")


def test_remove_then_rename_fallback(tmp_path, monkeypatch):
    """A filesystem whose rename refuses an existing target (MicroPython has no os.replace)."""
    path = str(tmp_path / "live.mfck")
    old, new = build(3), build(4)
    ck.save(path, old, {"v": "old"})
    monkeypatch.delattr(ck.os, "replace")
    real_rename = os.rename
    calls = []

    def strict_rename(a, b):
        calls.append(b)
        if os.path.exists(b):
            raise OSError(17, "exists")
        if len(calls) == 2 and crash[0]:
            raise _Crash()          # power lost between remove and rename
        real_rename(a, b)
    crash = [True]
    monkeypatch.setattr(ck.os, "rename", strict_rename)
    with pytest.raises(_Crash):
        ck.save(path, new, {"v": "new"})
    assert not os.path.exists(path) and os.path.exists(path + ".tmp")
    m = build(9)
    assert nospec(ck.load(path, m)) == {"v": "new"} and snapshot(m) == snapshot(new)    # from the tmp
    assert nospec(ck.read(path)[0]) == {"v": "new"}
    crash[0] = False
    calls.clear()
    ck.save(path, old, {"v": "old"})            # no target: plain rename
    assert nospec(ck.load(path, m)) == {"v": "old"} and snapshot(m) == snapshot(old)
    # main missing and the tmp only half written: refused, not taken
    data = open(path, "rb").read()
    os.remove(path)
    with open(path + ".tmp", "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        ck.load(path, m)


def test_killed_micropython_mid_save(tmp_path, micropython):
    """SIGKILL a MicroPython process that saves in a loop; every survivor file is one whole save.

    At least 24 kills land at random moments, and more until at least 2 of them caught a save
    half written (a .tmp beside the file) and 3 left a file behind; at most 200. A save checks
    every weight before it opens the .tmp, so a kill finds one being written 1 time in 4 to 15:
    a fixed 12 kills caught none about 1 run in 7."""
    path = str(tmp_path / "kill.mfck")
    script = helpers.script("checkpoint_kill_mp.py")
    env = helpers.micropython_env()
    rng = random.Random(7)
    tmp_seen = checked = kills = 0
    while (kills < 24 or tmp_seen < 2 or checked < 3) and kills < 200:
        kills += 1
        p = subprocess.Popen([micropython, "-X", "heapsize=4M", str(script), path],
                             stdout=subprocess.PIPE, env=env)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.05 + rng.random() * 0.3)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if os.path.exists(path + ".tmp"):
            tmp_seen += 1
        if not os.path.exists(path):
            continue            # killed before the first save completed
        tag, meta, tensors = checkpoint_np.read(path)
        k = meta["k"]
        for name, a in tensors.items():
            flat = a.reshape(-1)
            assert flat[0] == k and flat[-1] == k, (kills, name, k)
        assert ck.load(path, checkpoint_kill_mp.build())["k"] == k
        checked += 1
    print("kills: %d; that left a partial .tmp: %d; survivors checked: %d" % (kills, tmp_seen, checked))
    assert tmp_seen >= 2 and checked >= 3, (kills, tmp_seen, checked)     # saves number k from 1


def test_micropython_board_filesystems(tmp_path, micropython):
    """littlefs v2 (the ESP32 default), littlefs v1 and FAT on RAM block devices: rename replaces;
    from every state an interrupted save can leave (checkpoint_states_mp.STATES), a save cut short
    after every 3rd byte (full volume, power cut; every byte on CPython in test_checkpoint_states)
    leaves the previous checkpoint loadable and a whole one the new; a volume too full for the
    save refuses it, naming the file, keeping the previous."""
    out = helpers.run_micropython(helpers.script("checkpoint_vfs_mp.py"), 3, exe=micropython)
    lines = out.splitlines()
    assert lines[:3] == ["lfs2 ok", "lfs1 ok", "fat ok"], out
    n = len(checkpoint_states_mp.STATES)
    size = len(checkpoint_states_mp.image(checkpoint_states_mp.model(5), str(tmp_path / "new.mfck"), "new"))
    cuts = len(range(0, size, 3))
    for kind in ("lfs2", "lfs1", "fat"):
        assert "%s states %d %d" % (kind, n * (2 * cuts + 1), n * (2 * cuts + 1)) in lines, out
        assert "%s full %d %d" % (kind, n, n) in lines, out
