"""finetune.Session on models other than Iris: windows ([L, C] inputs, a TransformerEncoderLayer-
style block and board/demos/sensor.py's Conv1D model), regression, parts by state_dict name / glob / kind,
metadata checked at session start. tests/mp/session_models_mp.py holds the checks; it runs under
CPython and inside MicroPython (both interpreters). The printouts are checked here, on CPython.
"""
import os

import pytest

import helpers
import microformer as mf
import session_models_mp


def test_session_models_cpython(tmp_path):
    session_models_mp.ROOT = str(tmp_path)
    session_models_mp.check(session_models_mp.run(str(tmp_path)))


def test_session_models_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("session_models_mp.py"), str(tmp_path), heap="8M",
                                  exe=micropython)
    assert "SESSION MODELS OK" in out, out


def _window_flash(tmp_path, **change):
    os.makedirs(str(tmp_path / "data"))
    meta = session_models_mp.window_meta()
    meta.update(change)
    for k in [k for k in meta if meta[k] is None]:
        del meta[k]
    mf.save_checkpoint(str(tmp_path / "model.mfck"), session_models_mp.window_model(), meta)
    session_models_mp.write_csv(str(tmp_path / "data" / "win.csv"), ["v%d" % i for i in range(18)] + ["label"],
                                session_models_mp.window_rows(20, 5))
    return str(tmp_path)


def test_freeze_prints_what_changed(tmp_path, capsys):
    import finetune
    s = finetune.Session(root=_window_flash(tmp_path), verbose=True)
    capsys.readouterr()
    s.freeze("head", "2.norm1")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("freeze 4 parameters (43 params): 4.weight 3x8, 4.bias 3, 2.norm1.weight 8, "
                      "2.norm1.bias 8"), out
    total = s.model.param_count()
    assert out[1] == ("trainable params %d of %d; frozen: 2.norm1.weight, 2.norm1.bias, 4.weight, 4.bias"
                      % (total - 43, total)), out
    s.freeze("4.bias")
    assert capsys.readouterr().out.splitlines()[0] == "freeze 0 parameters (0 params) (already frozen)"
    s.unfreeze("*.bias")
    assert capsys.readouterr().out.splitlines()[0] == "unfreeze 2 parameters (11 params): 2.norm1.bias 8, 4.bias 3"


def test_notes_for_defaulted_metadata_are_printed_once(tmp_path, capsys):
    import finetune
    root = _window_flash(tmp_path, n_train=None, split_seed=None)
    s = finetune.Session(root=root, verbose=True)
    out = capsys.readouterr().out
    assert out.count("note: ") == 2, out
    assert ("note: split: the checkpoint gives none ('split' or 'n_train'): the board chose 4 of the 20 rows "
            "of %s/data/win.csv as 'test' (20%%, shuffled with split_seed 0) and keeps them in the checkpoint's "
            "metadata: s.save() writes them, and every later session uses the same rows" % root) in out, out
    assert "note: split_seed: 0 (shuffles the base data before the train/test split)" in out, out
    # the default split is what evaluate uses: 4 test rows
    assert s.evaluate("test", verbose=False)["n"] == 4
    s.evaluate("test")
    assert "note:" not in capsys.readouterr().out


def test_base_data_none_is_said(tmp_path, capsys):
    import finetune
    root = _window_flash(tmp_path, data=None)
    s = finetune.Session(root=root, verbose=True)
    out = capsys.readouterr().out
    assert "note: base data: none (the metadata names no 'data' file; Session(data=...) names one)" in out, out
    with pytest.raises(ValueError, match="no base data .the checkpoint's metadata names no 'data' file"):
        s.evaluate("test")
    # Session(data=...) names one
    t = finetune.Session(root=root, data="data/win.csv", verbose=False)
    assert t.evaluate("test", verbose=False)["n"] == 2
