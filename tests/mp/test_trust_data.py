"""Data boundaries: NaN / inf / malformed readings never reach a model, and every refusal names
the file, line and column (or the example and feature) with what was expected and what was read.

tests/mp/trust_data_mp.py holds the checks; they run under CPython and inside MicroPython (both
interpreters, both backends).
"""
import json

import pytest

import helpers

SCRIPT = helpers.script("trust_data_mp.py")


def _has(msg, *words):
    for w in words:
        assert w in msg, "%r not in %r" % (w, msg)


def _oserror(msg, *words):
    # OSError (MicroPython) or its subclass FileNotFoundError (CPython), errno ENOENT
    assert msg.startswith(("OSError: ", "FileNotFoundError: ")) and "2" in msg.split(":")[1], msg
    _has(msg, *words)


def _check(r):
    # read_csv: file, line, column (name) and the value, for every fault
    _has(r["csv_nan"], "NonFiniteError", "nan.csv line 3", "column 1 (sepal_length)", "nan", "not finite")
    _has(r["csv_inf"], "NonFiniteError", "inf.csv line 4", "column 2 (sepal_width)", "-inf", "not finite")
    _has(r["csv_1e39"], "NonFiniteError", "big.csv line 2", "column 3 (petal_length)", "1e39", "float32")
    _has(r["csv_text"], "ValueError", "text.csv line 3", "column 3 (petal_length)", "'abc'", "not a number")
    _has(r["csv_short"], "ValueError", "short.csv line 2", "2 fields", "expected 3")
    _has(r["csv_long"], "ValueError", "long.csv line 3", "4 fields", "expected 3")
    _has(r["csv_nolabel"], "ValueError", "nolabel.csv line 3", "empty label")
    _oserror(r["csv_missing"], "read_csv", "no such file", "no-such-file.csv")
    assert r["nohead_rows"] == 6 and r["good_rows"] == 6
    assert [round(v, 4) for v in r["nohead_first"]] == [5.1, 3.5, 1.4, 0.2]
    _has(r["nohead_strict"], "ValueError", "nohead.csv line 1", "header")
    assert r["good_features"] == ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    # Dataset and a model's input: example index and feature
    _has(r["dataset_nan"], "NonFiniteError", "Dataset", "example 1", "feature 1", "nan")
    _has(r["dataset_inf"], "NonFiniteError", "Dataset", "example 2", "feature 0 (width)", "inf")
    _has(r["dataset_label"], "ValueError", "Dataset", "label", "index 1", "[0, 2)", "3")
    _has(r["forward_nan"], "NonFiniteError", "Sequential", "example 1", "feature 0", "nan")
    _has(r["forward_inf"], "NonFiniteError", "Sequential", "example 0", "feature 1", "-inf")
    _has(r["evaluate_width"], "ValueError", "evaluate", "3", "2 classes")
    # errors that name the thing and expected vs got
    _has(r["ce_none"], "ValueError", "CrossEntropyLoss", "labels", "B=1", "NoneType")
    _has(r["summary_attention"], "ValueError", "layer 0", "Attention", "[B,S,8]", "(2, 8)")
    _has(r["summary_dense"], "ValueError", "layer 1", "from layer 0", "Dense", "[..., 5]", "(2, 8)")
    _has(r["show_before_forward"], "RuntimeError", "Attention", "forward first")
    _has(r["reshape_int"], "ValueError", "Reshape", "tuple", "got 4")
    for v in ("inf", "nan", "0.0"):
        _has(r["layernorm_eps_" + v.replace(".0", "")], "ValueError", "LayerNorm", "eps", "finite", "> 0", v)

    _oserror(r["session_missing"], "Session", "no checkpoint", "nope.mfck")
    _has(r["add_inf"], "NonFiniteError", "add_example", "feature 1 (sepal_length)", "inf")
    # 1e39 is inf in float32 (on a single-precision port the literal itself is already inf)
    _has(r["add_1e39"], "NonFiniteError", "add_example", "feature 1 (sepal_length)")
    assert "1e+39 (inf in float32)" in r["add_1e39"] or "is inf;" in r["add_1e39"], r["add_1e39"]
    _has(r["add_nan"], "NonFiniteError", "add_examples", "example 1", "feature 2 (sepal_width)", "nan")
    assert r["user_file_after_bad_adds"] is None and r["examples_after_bad_adds"] == 0
    _has(r["predict_inf"], "NonFiniteError", "predict", "feature 1 (sepal_length)", "inf")
    _has(r["predict_1e39"], "NonFiniteError", "predict", "feature 4 (petal_width)")
    assert "-1e+39 (-inf in float32)" in r["predict_1e39"] or "is -inf;" in r["predict_1e39"]
    _has(r["fit_list_nan"], "NonFiniteError", "fit", "example 1", "feature 3 (petal_length)", "nan")
    _has(r["evaluate_list_inf"], "NonFiniteError", "evaluate", "example 1", "feature 1", "inf")
    assert r["weights_unchanged"]
    _has(r["session_nan_row"], "NonFiniteError", "user.csv line 3", "column 2 (sepal_width)", "nan",
         "Fix or delete that line")
    assert r["reloaded_examples"] == 1
    _has(r["session_lr_inf"], "ValueError", "Session", "lr", "inf")
    _has(r["fit_lr_inf"], "ValueError", "fit", "lr", "inf")
    _has(r["fit_lr_nan"], "ValueError", "fit", "lr", "nan")
    # fit: every argument checked before anything changes; a refused step rolls the call back
    for tag, words in (("epochs_neg", ("epochs", "int >= 1", "-1")), ("epochs_str", ("epochs", "'5'")),
                       ("epochs_bool", ("epochs", "True")), ("epochs_0", ("epochs", "got 0")),
                       ("lr_neg", ("lr", "-0.1")), ("verbose_str", ("verbose", "'yes'")),
                       ("on_error", ("on_error", "'rollback'", "'undo'")), ("data", ("data", "'nope'"))):
        _has(r["fitarg_" + tag], "ValueError: fit: ", *words)
        assert r["fitarg_" + tag + "_unchanged"], tag
    _has(r["rollback_err"], "NonFinite", "rolled back", "1 step undone")
    assert r["rollback_unchanged"] and r["rollback_records"] == 1, r["rollback_err"]
    _has(r["keep_err"], "NonFinite", "on_error='keep'", "1 step of this call")
    assert r["keep_changed"] and r["keep_steps"] == 1, r["keep_err"]
    assert r["keep_record"] == [1, r["keep_err"].split(":")[0]] and r["keep_records"] == 2, r["keep_record"]
    # every run has large-input cases (the viper run: LayerNorm only, its kernels are its own)
    assert any(k.startswith("ln") for k in r["big"]), sorted(r["big"])
    _check_big(r["big"])

def _check_big(big):
    """Attention and LayerNorm on inputs up to 1e20 / 1e30 against the float64 reference."""
    import numpy as np
    import reference as R
    for key, d in big.items():
        if key.startswith("attn"):
            x = np.array(d["x"]).reshape(1, 5, 8)
            p = dict((n.split(".")[1], np.array(v)) for n, v in d["p"].items())
            for n in ("Wq", "Wk", "Wv", "Wo"):
                p[n] = p[n].reshape(8, 8)
            want, _ = R.attention_forward(x, p, 2)
        else:
            x = np.array(d["x"]).reshape(3, 6)
            want, _ = R.layernorm_forward(x, np.ones(6), np.zeros(6))
        got = np.array(d["y"])
        assert np.isfinite(got).all(), key
        helpers.assert_close(got, want, 1e-4, key)


def test_data_boundaries_cpython(tmp_path):
    import microformer as mf
    import trust_data_mp
    try:
        r = json.loads(json.dumps(trust_data_mp.run(str(tmp_path), "python")))
    finally:
        mf.set_backend("python")
    _check(r)


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_data_boundaries_micropython(tmp_path, micropython, backend):
    out = tmp_path / "out.json"
    flash = tmp_path / "flash"
    flash.mkdir()
    helpers.run_micropython(SCRIPT, str(flash), backend, str(out), heap="2M", exe=micropython)
    _check(json.loads(out.read_text()))
