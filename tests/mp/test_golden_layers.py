"""Golden vectors of the DecoderBlock and Conv1D (tests/oracles/golden_vectors.py -> tests/golden/decoder.mfg,
conv1d.mfg, from tests/oracles/reference.py): the files are current, and lib's layers match forward and every
gradient on CPython (both backends) and inside MicroPython (both interpreters, both backends)."""
import os

import numpy as np
import pytest

import helpers
import golden_vectors as host_golden
import microformer as mf
from microformer import golden

DIR = host_golden.DEFAULT_DIR
CASES = {"decoder.mfg": host_golden.decoder_case, "conv1d.mfg": host_golden.conv1d_case}
CHECKS = {"decoder.mfg": golden.check_decoder, "conv1d.mfg": golden.check_conv1d}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_file_is_current(name):
    problems = host_golden.stale(os.path.join(DIR, name), CASES[name]())
    assert not problems, "tests/golden/%s is stale (%s): run python tests/oracles/golden_vectors.py" % (name, problems)


def test_cli_writes_every_case_and_refuses_a_file(tmp_path):
    out = helpers.run_cpython(os.path.join(helpers.ORACLES, "golden_vectors.py"), str(tmp_path))
    for name in ("attention.mfg", "decoder.mfg", "conv1d.mfg"):
        assert not host_golden.stale(os.path.join(DIR, name), host_golden.read(str(tmp_path / name))), name
        assert name in out
    f = tmp_path / "afile"
    f.write_text("x")
    import subprocess
    import sys
    r = subprocess.run([sys.executable, os.path.join(helpers.ORACLES, "golden_vectors.py"), str(f)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "is not a directory" in r.stderr and f.read_text() == "x"


def test_records_cover_every_parameter():
    rec = dict(host_golden.read(os.path.join(DIR, "decoder.mfg")))
    B, S, Sk, E, H, F, _ = [int(v) for v in rec["config"]]
    blk = mf.DecoderBlock(E, H, F)
    for p, _ in blk.params():
        assert rec[p.name].shape == p.shape and rec["d" + p.name].shape == p.shape, p.name
    assert rec["tgt_mask"].any() and rec["memory_mask"].any()       # the case has padding
    assert np.all(rec["dmemory"][rec["memory_mask"].astype(bool)] == 0)
    rc = dict(host_golden.read(os.path.join(DIR, "conv1d.mfg")))
    _, _, _, _, _, stride, padding, dilation, groups, _ = [int(v) for v in rc["config"]]
    assert stride > 1 and padding > 0 and dilation > 1 and groups > 1


@pytest.mark.parametrize("backend", ["python", "numpy"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_lib_cpython(backend, name):
    try:
        errors = CHECKS[name](os.path.join(DIR, name), backend)
    finally:
        mf.set_backend("numpy")
    assert len(errors) >= 4
    assert max(errors.values()) <= 1e-5, errors


def test_golden_catches_a_wrong_value(tmp_path):
    """A damaged expected value is reported: the check compares, it does not just run."""
    for name, key in (("decoder.mfg", "dcross_attn.Wv"), ("conv1d.mfg", "dW")):
        rec = host_golden.read(os.path.join(DIR, name))
        rec = [(n, a.astype(np.float64) + (0.01 if n == key else 0.0)) for n, a in rec]
        bad = tmp_path / name
        host_golden.write(str(bad), rec)
        errors = CHECKS[name](str(bad), "python")
        assert errors[key] > 1e-3 and max(v for k, v in errors.items() if k != key) <= 1e-5


def test_golden_lib_micropython(micropython):
    out = helpers.run_micropython(helpers.script("golden_layers_mp.py"), DIR, exe=micropython)
    assert "GOLDEN LAYERS OK" in out, out
    assert out.count("\n") == 5
