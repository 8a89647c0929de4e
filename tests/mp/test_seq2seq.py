"""The seq2seq demo: a short host training run reverses held-out digit strings far better than
copying the input does, the checkpoint rebuilds from its spec, and MicroPython (portable and viper
backends, both ports) greedy-decodes the same outputs from the same checkpoint as CPython."""
import json
import os

import pytest

import helpers
import microformer as mf
import seq2seq
import seq2seq_mp

HOST_SEQ2SEQ = os.path.join(helpers.TOOLS, "train_seq2seq.py")
N_MP = 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq2seq") / "seq2seq.mfck"
    r = helpers.run_cpython(HOST_SEQ2SEQ, "--steps", "300", "--quiet", "--out", str(out))
    return str(out), r


def test_heldout_never_trained_on_and_task_is_not_copying():
    held = seq2seq.heldout()
    assert len(set(tuple(s) for s in held)) == seq2seq.N_HELDOUT
    src, lengths = seq2seq.source_batch(held[:3])
    assert lengths == [len(s) + 1 for s in held[:3]]
    _, _, tgt, labels = seq2seq.training_batch([[1, 2, 3]])
    S = seq2seq.MAX_LEN + 1
    assert tgt[0][:4] == [seq2seq.BOS, seq2seq.DIGIT0 + 3, seq2seq.DIGIT0 + 2, seq2seq.DIGIT0 + 1]
    assert labels[:4] == [seq2seq.DIGIT0 + 3, seq2seq.DIGIT0 + 2, seq2seq.DIGIT0 + 1, seq2seq.EOS]
    assert len(labels) == S


def test_host_training_beats_copying(trained):
    path, stdout = trained
    model, meta = mf.load_model(path, with_meta=True)
    r = seq2seq.evaluate(model, seq2seq.heldout())
    assert r["copy"] < 0.1
    assert r["exact"] >= 0.6, "held-out exact match %.3f after a short run" % r["exact"]
    assert r["exact"] >= r["copy"] + 0.5
    assert abs(meta["host_heldout_exact"] - r["exact"]) < 1e-9
    assert "held-out exact match %.1f%%" % (100 * r["exact"]) in stdout


@pytest.mark.parametrize("backend,n", [("viper", N_MP), ("python", 10)])
def test_micropython_decodes_as_cpython(trained, tmp_path, micropython, backend, n):
    path, _ = trained
    want = seq2seq_mp.run(path, n, "numpy")
    mf.set_backend("numpy")
    dst = tmp_path / "out.json"
    helpers.run_micropython(helpers.script("seq2seq_mp.py"), path, n, backend, str(dst), heap="8M", exe=micropython)
    got = json.loads(dst.read_text())
    assert len(got["outputs"]) == n
    assert got["outputs"] == want["outputs"], "MicroPython %s vs CPython greedy outputs differ" % backend


def test_main_refuses_another_task(trained, tmp_path):
    path, _ = trained
    model, meta = mf.load_model(path, with_meta=True)
    meta["task"]["max_len"] = 5
    other = str(tmp_path / "other.mfck")
    mf.save_checkpoint(other, model, meta)
    with pytest.raises(ValueError) as e:
        seq2seq.main(other, verbose=False)
    assert "is for task" in str(e.value)
