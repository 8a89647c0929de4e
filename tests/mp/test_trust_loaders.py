"""Every loader checks the whole file, then applies it: a refused adapter, int8 record, checkpoint
or metadata leaves the model as it was, and the refusal names the file and the field. The same
checks on load as on save (finite values, float32 range, ranks and shapes against the model,
names a CSV can hold). tests/mp/trust_loaders_mp.py holds the checks; they run under CPython and
inside MicroPython (both interpreters)."""
import json

import helpers
import trust_loaders_mp


def _has(msg, *words):
    for w in words:
        assert w in msg, "%r not in %r" % (w, msg)


def _check(r):
    # adapters: refused from the header / the data, the model untouched, the file named
    _has(r["rank"], "CheckpointError", "rank.adapter.mfck", "(the rank its metadata", "100000")
    _has(r["extra"], "CheckpointError", "extra.adapter.mfck", "9.lora_A")
    _has(r["target"], "CheckpointError", "target.adapter.mfck", "7.q_proj")
    _has(r["nan"], "CheckpointError", "nan.adapter.mfck", "4.v_proj.lora_B", "index 3", "nan")
    _has(r["read_nan"], "CheckpointError", "nan.adapter.mfck", "4.v_proj.lora_B", "index 3", "nan")
    _has(r["inf"], "CheckpointError", "inf.adapter.mfck", "4.q_proj.lora_A", "index 0", "-inf")
    for k in ("rank", "extra", "target", "nan", "inf"):
        assert r[k + "_same"] is True, k
        assert r[k + "_tensors"] == 13, (k, r[k + "_tensors"])     # no adapter added
    assert r["good_tensors"] == 21
    # int8 records: the whole table is checked before any weight becomes int8
    _has(r["int8_pos"], "CheckpointError", "q8pos.mfck", "3.W")
    _has(r["scale_nan"], "CheckpointError", "q8scale_nan.mfck", "4.Wv", "scale", "row 1", "nan")
    _has(r["scale_inf"], "CheckpointError", "q8scale_inf.mfck", "4.Wv", "scale", "row 1", "inf")
    _has(r["scale_ninf"], "CheckpointError", "q8scale_ninf.mfck", "4.Wv", "scale", "row 1", "-inf")
    for k in ("int8_pos", "scale_nan", "scale_inf", "scale_ninf"):
        assert r[k + "_same"] is True and r[k + "_int8"] is False, k
    _has(r["weight_nan"], "CheckpointError", "wnan.mfck", "6.W", "index 5", "nan")
    assert r["weight_nan_same"] is True
    # merge: every new weight checked before the first is written
    _has(r["merge_inf"], "ValueError", "merge_lora", "4.v_proj", "float32")
    assert r["merge_inf_same"] is True and r["merge_inf_adapters"] == 4
    _has(r["state_dict_int8"], "TypeError", "load_state_dict", "6.weight", "stored as int8")
    assert r["state_dict_int8_same"] is True
    # metadata: float32 range and names a CSV can hold
    # (on a single-precision port the literal 1e39 is already inf: refused as not finite)
    for k, key in (("meta_std_big", "'std'"), ("meta_mean_big", "'mean'")):
        _has(r[k], "MetaError", "g.mfck", key)
        assert "float32" in r[k] or "finite numbers" in r[k] and "inf" in r[k], r[k]
    _has(r["meta_std_tiny"], "MetaError", "g.mfck", "'std'")       # (there 1e-46 is 0.0 already)
    assert "float32" in r["meta_std_tiny"] or "numbers > 0" in r["meta_std_tiny"], r["meta_std_tiny"]
    assert r["meta_std_ok"] == "no error", r["meta_std_ok"]
    for k, key in (("class_comma", "classes"), ("class_newline", "classes"), ("class_space", "classes"),
                   ("class_trail", "classes"), ("class_quote", "classes"), ("feature_comma", "features"),
                   ("target_comma", "targets")):
        _has(r["meta_" + k], "MetaError", "g.mfck", "'%s'" % key, "CSV")
    assert r["meta_names_ok"] == "no error", r["meta_names_ok"]


def _check_losses(r):
    _has(r["mse_overflow"], "NonFiniteLossError", "MSELoss", "float32")
    assert r["ce_ok"] == "no error" and r["mse_big_ok"] == "no error", (r["ce_ok"], r["mse_big_ok"])


def test_losses_cpython():
    r = {}
    trust_loaders_mp.losses(r)
    _check_losses(r)


def test_loaders_cpython(tmp_path):
    _check(trust_loaders_mp.run(str(tmp_path)))


def test_loaders_micropython(tmp_path, micropython):
    out = tmp_path / "out.json"
    # a board without PSRAM: a rank-100000 adapter would need 3.2 MB per map
    helpers.run_micropython(helpers.script("trust_loaders_mp.py"), tmp_path, out, heap="512K", exe=micropython)
    r = json.loads(out.read_text())
    _check(r)
    _check_losses(r)
