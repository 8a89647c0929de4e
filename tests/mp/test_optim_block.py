"""The optimizer holds its state in one block per slot and a scratch for a group of tensors, not
shadow copies of the model (tests/mp/optim_block_mp.py, under CPython and both MicroPython ports):
the exponent bound that lets a step skip its dry run is checked against the float32 bits, a step
the bound covers calls the update kernel once per group, one it cannot cover (a huge finite
gradient) runs the dry run first and is still taken, and any grouping of the tensors gives the
same bits, a tensor larger than the group included (updated in pieces: the scratch stays the
group's size; a piece's non-finite result names its tensor and changes nothing)."""
import json
import struct

import pytest

import helpers

SCRIPT = helpers.script("optim_block_mp.py")


def field(x):
    return (struct.unpack("<I", struct.pack("<f", x))[0] >> 23) & 0xFF


def _check(r):
    assert r["fields"] == r["oracle"], (r["fields"], r["oracle"])
    assert r["oracle"][3] == 0 and r["oracle"][4] == 127 and r["oracle"][-1] == 254   # subnormals, 1.0, 3e38
    assert r["nonfinite"] == [255, 255, 255]
    assert r["pairs"] == r["pairs_oracle"] and r["pairs_oracle"] == [field(1e30), field(7e20)], r["pairs"]
    assert r["pairs_nan"] == 255
    for tag in ("adam", "adamw", "sgd"):
        g = r["groups_" + tag]
        assert g[0] > g[1] > g[2] == 1, (tag, g)      # GROUP 500, 1024 (the 40 x 40 weights in pieces either way), all
        assert r["same_" + tag], tag
    assert r["calls_covered"] == r["groups"] > 1
    assert r["huge_step"] == "taken" and r["calls_huge"] == 2 * r["groups"], r
    assert r["steps"] == 3 and r["finite"]
    assert r["blocks"] == [r["numel"], r["numel"]]
    assert r["scratch"] == [r["stretch"]] * 3
    assert r["stretch"] == 1024 < r["largest"] < r["numel"]        # optim.GROUP as documented
    # a tensor of 5,000 floats: pieces of at most 1024, the same bits as one group of everything
    assert r["big_largest"] == 5000 and r["big_scratch"] == [1024] * 3, r
    assert r["big_same"]
    assert r["big_refused"].startswith("NonFiniteError") and "make 0.W non-finite" in r["big_refused"], r["big_refused"]
    assert r["big_unchanged"]


def test_optim_block_cpython():
    import microformer as mf
    import optim_block_mp
    try:
        for name in ("python", "numpy"):
            _check(json.loads(json.dumps(optim_block_mp.run(name))))
    finally:
        mf.set_backend("python")


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_optim_block_micropython(tmp_path, micropython, backend):
    out = tmp_path / "out.json"
    helpers.run_micropython(SCRIPT, backend, str(out), heap="4M", exe=micropython)
    _check(json.loads(out.read_text()))
