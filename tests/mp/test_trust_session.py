"""The board session's loaders (tests/mp/trust_session_mp.py, under CPython and both MicroPython
ports): load_adapter after an unsaved fit refuses instead of replacing the fitted weights; a
refused adapter leaves a session that saves; user data with an invalid UTF-8 byte names the file
and the line; a user.csv too big for the heap names that file; read_csv of a missing file names
it."""
import json

import helpers
import trust_session_mp


def _has(msg, *words):
    for w in words:
        assert w in msg, "%r not in %r" % (w, msg)


def _check(r, big):
    _has(r["adapter_after_fit"], "ValueError", "load_adapter", "fitted", "not saved", "s.save()")
    assert r["adapter_after_fit_same"] is True
    _has(r["adapter_bad"], "CheckpointError", "bad.adapter.mfck", "9.lora_A")
    _has(r["adapter_bad_session"], "CheckpointError", "bad.adapter.mfck", "9.lora_A")
    assert r["adapter_bad_save"] == "no error", r["adapter_bad_save"]
    _has(r["user_utf8"], "ValueError", "user.csv line 3", "UTF-8")
    assert r["read_csv_missing"].startswith(("OSError", "FileNotFoundError")), r["read_csv_missing"]
    _has(r["read_csv_missing"], "nope.csv", "no such file")
    if big:
        _has(r["user_big"], "MemoryError", "user.csv")
        assert "gesture.mfck" not in r["user_big"], r["user_big"]


def test_session_loaders_cpython(tmp_path):
    _check(trust_session_mp.run(str(tmp_path), False), False)


def test_session_loaders_micropython(tmp_path, micropython):
    out = tmp_path / "out.json"
    helpers.run_micropython(helpers.script("trust_session_mp.py"), tmp_path, out, "big", heap="1M",
                            exe=micropython)
    _check(json.loads(out.read_text()), True)
