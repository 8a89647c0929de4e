"""Errors that name the file and what is wrong: a save into a missing folder, a full volume
(littlefs says errno 36 when it cannot create the file's entry), a failing medium; and
PositionalEncoding's start argument. On CPython and both MicroPython ports."""
import json
import os

import pytest

import helpers
from microformer import checkpoint as ck
import checkpoint_states_mp as cs

SCRIPT = helpers.script("checkpoint_errors_mp.py")


def _check(out, d):
    res = {}
    for line in out.splitlines():
        r = json.loads(line)
        res[r["case"]] = r
    r = res.pop("missing_directory")
    assert r["errno"] == 2 and r["exc"] in ("OSError", "FileNotFoundError"), r
    assert "no such directory %r" % (d + "/nodir") in r["msg"] and d + "/nodir/x.mfck" in r["msg"], r
    path = d + "/m.mfck"
    for case in ("littlefs_36_at_open", "enospc_at_open", "enospc_mid_write"):
        r = res.pop(case)
        assert r["errno"] == 28 and "no space left" in r["msg"] and path + ".tmp" in r["msg"], r
        assert "%r is unchanged" % path in r["msg"] and r["old_loads"] and r["files"] == ["m.mfck"], r
    r = res.pop("littlefs_36_no_checkpoint_before")
    assert r["errno"] == 28 and "no space left" in r["msg"] and "no checkpoint at %r before" % path in r["msg"], r
    assert r["files"] == [], r
    r = res.pop("eio_mid_write")
    assert r["errno"] == 5 and "writing %r failed" % (path + ".tmp") in r["msg"], r
    assert "%r is unchanged" % path in r["msg"] and r["old_loads"] and r["files"] == ["m.mfck"], r
    for who in ("PositionalEncoding", "LearnedPositionalEmbedding"):
        for start, text in (("1.0", "start must be an int (the position of the first token), got 1.0 (float)"),
                            ("True", "start must be an int (the position of the first token), got True (bool)"),
                            ("'0'", "got '0' (str)"),
                            ("-1", "start must be >= 0, got -1"),
                            ("6", "positions 6..8 exceed max_len=8: start + S must be <= 8, got start=6, S=3 (9)")):
            r = res.pop("%s start=%s" % (who, start))
            assert r["exc"] == "ValueError" and r["msg"].startswith(who + ": ") and text in r["msg"], r
    assert not res, res


def test_errors_name_the_file_cpython(tmp_path):
    _check(helpers.run_cpython(SCRIPT, str(tmp_path)), str(tmp_path))


def test_errors_name_the_file_micropython(tmp_path, micropython):
    _check(helpers.run_micropython(SCRIPT, str(tmp_path), exe=micropython), str(tmp_path))


def test_a_lone_tmp_that_cannot_be_renamed_is_kept(tmp_path, monkeypatch):
    """The promotion of a lone complete .tmp fails (a read-only volume): nothing is written, the
    .tmp stays, and the error says which file holds the checkpoint."""
    path = str(tmp_path / "m.mfck")
    old = cs.model(3)
    data = cs.image(old, path, "old")
    cs.put(path + ".tmp", data)

    def refuse(a, b):
        raise OSError(30, "read-only file system")
    monkeypatch.setattr(ck.os, "replace", refuse)
    with pytest.raises(OSError) as e:
        ck.save(path, cs.model(5))
    monkeypatch.undo()
    msg = str(e.value)
    assert e.value.errno == 30 and "%r is missing and %r holds the last complete checkpoint" % (
        path, path + ".tmp") in msg and "nothing was written" in msg, msg
    assert sorted(os.listdir(tmp_path)) == ["m.mfck.tmp"]
    assert open(path + ".tmp", "rb").read() == data
    assert cs._load(path) == cs.snap(old)
