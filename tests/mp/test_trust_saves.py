"""Saves never make things worse: refused before the old file is touched, no stray .tmp, a full
volume gets its space back, paths are named, pathlib works (CPython and inside MicroPython)."""
import json
import os
import pathlib
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

import helpers
import microformer as mf
from microformer import checkpoint as ck
import checkpoint_np



def nospec(meta):
    """meta without the 'spec' that checkpoint.save adds."""
    return {k: meta[k] for k in meta if k != "spec"}

def build(seed):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(4, 16), mf.ActivationLayer("relu"), mf.Reshape((4, 4)),
                          mf.Attention(4, 2), mf.GlobalAvgPool(), mf.Dense(4, 3)])


def snap(m):
    return [bytes(p.data) for _, p in m.named_params()]


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "m.mfck"
    model = build(3)
    ck.save(str(path), model, {"v": "old"})
    return str(path), model, path.read_bytes()


def assert_untouched(path, model, before):
    assert open(path, "rb").read() == before
    assert not os.path.exists(path + ".tmp")
    m = build(9)
    assert nospec(ck.load(path, m)) == {"v": "old"} and snap(m) == snap(model)


# ---- refused before the old file is touched ---------------------------------------------------

@pytest.mark.parametrize("meta,where", [
    ({"best_loss": float("inf")}, "meta['best_loss']"),
    ({"best_loss": float("-inf")}, "meta['best_loss']"),
    ({"history": [{"loss": 0.5}, {"loss": float("nan")}]}, "meta['history'][1]['loss']"),
    ({"classes": {"a", "b"}}, "meta['classes']"),
    ({"mean": np.float32(1.5)}, "meta['mean']"),
    ({1: "x"}, "key 1"),
])
def test_bad_metadata_refused_before_the_old_file_is_touched(good, meta, where):
    path, model, before = good
    with pytest.raises(ValueError) as e:
        ck.save(path, build(4), meta)
    assert where in str(e.value)
    assert_untouched(path, model, before)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e39])
def test_non_finite_weights_refused_naming_tensor_and_index(good, value):
    path, model, before = good
    bad = build(4)
    name, p = bad.named_params()[2]
    p.data[7] = value               # 1e39 is inf in float32
    with pytest.raises(ValueError) as e:
        ck.save(path, bad, {"v": "new"})
    assert repr(name) in str(e.value) and "index 7" in str(e.value)
    assert_untouched(path, model, before)


def test_numpy_writer_refuses_the_same(tmp_path):
    """tests/oracles/checkpoint_np.py writes the same format: the same metadata rules, atomically."""
    path = tmp_path / "np.mfck"
    checkpoint_np.write(str(path), {"w": np.ones((2, 3))}, "T", {"v": 1})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="best_loss"):
        checkpoint_np.write(str(path), {"w": np.zeros((2, 3))}, "T", {"best_loss": float("inf")})
    with pytest.raises(ValueError, match="classes"):
        checkpoint_np.write(str(path), {"w": np.zeros((2, 3))}, "T", {"classes": {"a"}})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["np.mfck"]


# ---- failed saves leave nothing behind ---------------------------------------------------------

def test_save_to_a_directory_leaves_no_tmp(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(OSError, match="adir.*directory"):
        ck.save(str(d), build(4), {})
    assert sorted(os.listdir(tmp_path)) == ["adir"] and not os.listdir(d)


def test_failed_rename_keeps_the_old_file_and_removes_the_tmp(good, monkeypatch):
    path, model, before = good

    def refuse(a, b):
        raise OSError(13, "permission denied")
    monkeypatch.setattr(ck.os, "replace", refuse)
    with pytest.raises(OSError):
        ck.save(path, build(4), {"v": "new"})
    monkeypatch.undo()
    assert_untouched(path, model, before)


FSIZE_SCRIPT = r'''
import sys
sys.path.insert(0, sys.argv[2])
import microformer as mf
from microformer import checkpoint as ck
mf.seed(4)
m = mf.Sequential([mf.Dense(32, 128), mf.Dense(128, 32)])
try:
    ck.save(sys.argv[1], m, {"v": "big"})
    print("SAVED")
except OSError as e:
    print("OSERROR", e.args[0])
'''


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # write() then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))


@pytest.mark.parametrize("interp", ["cpython", "micropython"])
def test_write_failure_on_the_host_filesystem(good, tmp_path, interp):
    """A real write error from the OS (file size limit: EFBIG) in the middle of a save."""
    path, model, before = good
    script = tmp_path / "fsize.py"
    script.write_text(FSIZE_SCRIPT)
    exe = sys.executable if interp == "cpython" else helpers.micropython_path()
    out = subprocess.run([exe, str(script), path, helpers.LIB], capture_output=True, text=True,
                         timeout=120, preexec_fn=_limit_file_size)
    assert out.stdout.split() == ["OSERROR", "27"], out.stdout + out.stderr     # 27 = EFBIG
    assert_untouched(path, model, before)


# ---- paths -------------------------------------------------------------------------------------

def test_pathlib_paths(tmp_path):
    p = tmp_path / "p.mfck"
    model = build(3)
    n = ck.save(p, model, {"v": 1})
    assert p.stat().st_size == n
    m = build(9)
    assert nospec(ck.load(p, m)) == {"v": 1} and snap(m) == snap(model)
    assert nospec(ck.read_header(p)["meta"]) == {"v": 1}
    assert nospec(ck.read(p)[0]) == {"v": 1}
    assert "p.mfck" in ck.info(p, show=False)
    assert nospec(mf.load_checkpoint(p, build(9))) == {"v": 1}
    with pytest.raises(TypeError, match="path must be a str or a pathlib.Path, got int"):
        ck.save(3, model)


def test_missing_file_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.mfck")
    for call in (lambda: ck.load(missing, build(3)), lambda: ck.read_header(missing),
                 lambda: ck.read(pathlib.Path(missing))):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert missing in str(e.value)


def test_session_on_a_missing_checkpoint_names_it(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(helpers.ROOT, "board"))
    import finetune
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError) as e:
        finetune.Session("nope.mfck")
    assert "nope.mfck" in str(e.value)


# ---- inside MicroPython, on board filesystems ---------------------------------------------------

def test_inside_micropython(micropython, tmp_path):
    """The same refusals in MicroPython; a save that does not fit on a FAT / littlefs2 volume."""
    out = helpers.run_micropython(helpers.script("trust_saves_mp.py"), str(tmp_path),
                                  exe=micropython)
    res = {}
    for line in out.splitlines():
        r = json.loads(line)
        res[r["case"]] = r
    expected = {"meta_inf", "meta_nan_nested", "meta_not_json", "weight_nan", "weight_inf",
                "weight_names", "directory", "missing_load", "missing_header", "full_fat", "full_lfs2"}
    assert set(res) == expected, out
    where = {"meta_inf": "meta['best_loss']", "meta_nan_nested": "meta['hist'][1]['loss']",
             "meta_not_json": "meta['f']"}
    names = res["weight_names"]["names"]
    where["weight_nan"] = "%r holds nan at index 5" % names[0]
    where["weight_inf"] = "%r holds inf at index 2" % names[1]
    for case, text in where.items():
        r = res[case]
        assert r["exc"] == "ValueError" and text in r["msg"], r
        assert r["same"] and r["loads"] and not r["tmp"], r
    assert res["directory"]["exc"] == "OSError" and "directory" in res["directory"]["msg"]
    assert res["directory"]["listing"] == ["adir", "m.mfck"]
    for case in ("missing_load", "missing_header"):
        r = res[case]
        assert r["errno"] == 2 and str(tmp_path / "nope.mfck") in r["msg"], r
    for kind in ("fat", "lfs2"):
        r = res["full_" + kind]
        assert r["exc"] == "OSError" and r["errno"] == 28 and "no space" in r["msg"], r
        assert r["free1"] == r["free0"], r                   # the space is given back
        assert r["files1"] == r["files0"] == ["filler.bin", "iris.mfck", "user.csv"], r
        assert r["loads"], r
        assert r["append"] is None and r["user"].endswith("5.1,3.5,1.4,0.2,setosa\n"), r
        assert r["save_after"] is None and r["loads_after"] and r["files2"] == r["files0"], r
