"""Examples from a sensor (board/mf_capture.py) and all-or-nothing, line-safe appends to the user
data file (board/mf_examples.py).

tests/mp/capture_mp.py holds the checks (CPython and both MicroPython ports): a simulated sensor
feeds capture for a flat model (one reading = one example) and a window model (L readings of C
channels, time-major, at rate_hz); a bad reading (short, text, bool, NaN, 1e39), a failing
read(), Ctrl-C and a bad label/count/rate write nothing; a file without a final newline gets
one instead of a merged row; a write that fails half way (a full flash, Ctrl-C) leaves the file
byte for byte as it was. test_capture_on_the_virtual_board does it over the REPL of the virtual
board, with a real Ctrl-C typed during a capture.
"""
import json
import re
import time

import helpers

SCRIPT = helpers.script("capture_mp.py")
HEADER = "sepal_length,sepal_width,petal_length,petal_width,label"


def _has(msg, *words):
    for w in words:
        assert w in msg, "%r not in %r" % (w, msg)


def _check(r):
    # a flat model: each reading is an example, appended with the label; a new Session reads them
    assert r["flat_pairs"] == [[[5.1, 3.5, 1.4, 0.2], "setosa"], [[6.0, 2.9, 4.5, 1.5], "setosa"]]
    assert r["flat_file"] == HEADER + "\n5.1,3.5,1.4,0.2,setosa\n6,2.9,4.5,1.5,setosa\n", r["flat_file"]
    assert r["flat_examples"] == r["flat_reloaded"] == r["flat_calls"] == 2
    _has(r["flat_n_wrong"], "ValueError", "n must be None or 1", "got 3")
    # a window model: 5 readings of 3 channels, time-major, two windows back to back at 50 Hz
    window = []
    for i in range(5):
        window += [float(i), 10.0 + i, 20.0 + i]
    assert r["window_added"] == [[window, "wave"], [window, "wave"]]
    assert 9 / 50 - 0.005 <= r["window_seconds"] < 1.0, r["window_seconds"]
    assert r["window_1ch"] == [[7.0, 7.0, 7.0]]
    _has(r["window_bad"], "ValueError", "example 1, reading 1 of 5", "3 numbers (ax, ay, az)", "[1.0, 2.0]")
    # refusals name the example, reading and value; a bad label or argument is refused before
    # read() is called; nothing is written in any case
    _has(r["refused_short"], "ValueError", "example 1, reading 1", "4 numbers (sepal_length", "[1.0, 2.0, 3.0]")
    _has(r["refused_text"], "ValueError", "value 2 (sepal_width) must be a number", "'2'")
    _has(r["refused_bool"], "ValueError", "value 3 (petal_length) must be a number", "True")
    _has(r["refused_number"], "ValueError", "4 numbers", "got 5.0")
    _has(r["refused_nan"], "NonFiniteError", "example 2", "feature 2 (sepal_width) is nan")
    _has(r["refused_inf"], "NonFiniteError", "example 2", "feature 3 (petal_length)", "inf")
    _has(r["refused_label"], "ValueError", "unknown label 'daisy'", "setosa")
    _has(r["refused_count"], "ValueError", "count must be an int >= 1", "got 0")
    _has(r["refused_rate"], "ValueError", "rate_hz", "> 0", "got 0")
    _has(r["refused_read_fails"], "OSError", "no IMU at 0x68")
    _has(r["not_callable"], "ValueError", "read must be a function", "[1, 2]")
    for tag in ("label", "count", "rate"):
        assert r["refused_%s_calls" % tag] == 0, tag
    assert r["refused_nan_calls"] == 2 and r["refused_read_fails_calls"] == 3
    assert r["ctrl_c"] == "KeyboardInterrupt"
    assert r["unchanged_after_refusals"]
    # a missing final newline is added: the hand-written row and the new one stay two rows
    assert r["repaired_tail"] == ["6.3,3.3,6.0,2.5,virginica", "4.9,3,1.4,0.2,setosa", ""], r["repaired_tail"]
    assert r["repaired_count"] == [3, 4, 4]
    # a write that fails half way: the file and the session's examples are as they were
    _has(r["write_enospc"], "OSError", "28", "user.csv", "no space left", "as it was")
    assert r["write_ctrl_c"] == "KeyboardInterrupt"
    for tag in ("enospc", "ctrl_c"):
        assert r["write_%s_unchanged" % tag] and r["write_%s_tmp" % tag] is None, tag
    _has(r["write_new"], "OSError", "new.csv", "as it was")
    assert r["write_new_file"] == [None, None]
    _has(r["store_nan"], "NonFiniteError", "user.csv", "feature 2 (sepal_width) is nan")
    # a complete .tmp left without its file is taken back; a cut one is not
    assert r["recovered"] == 4 and r["recovered_files"] == [True, True]
    assert r["cut"] == 0 and r["cut_files"] == [None, True]


def test_capture_cpython(tmp_path):
    import capture_mp
    _check(json.loads(json.dumps(capture_mp.run(str(tmp_path)))))


def test_capture_micropython(tmp_path, micropython):
    out = tmp_path / "out.json"
    flash = tmp_path / "flash"
    flash.mkdir()
    helpers.run_micropython(SCRIPT, str(flash), str(out), heap="2M", exe=micropython)
    _check(json.loads(out.read_text()))


SENSOR = """import finetune, mf_capture
s = finetune.Session(verbose=False)
s.clear_examples()
readings = [[5.0, 3.4, 1.5, 0.2], [6.7, 3.1, 4.4, 1.4], [6.9, 3.1, 5.4, 2.1]]
it = iter(readings)
def slow():
    return [5.0, 3.4, 1.5, 0.2]
"""


def test_capture_on_the_virtual_board(tmp_path, iris_checkpoint, deployed_flash):
    """The REPL on the virtual board (32-bit port when built, 512K heap): capture from a simulated
    sensor appends to /data/user.csv; a NaN reading and a Ctrl-C typed during a slow capture
    write nothing; the session goes on."""
    import deploy
    import vboard
    from test_trust_board import Term
    mp = helpers.interpreter_path(helpers.interpreters()[-1])
    deployed_flash(tmp_path, mp)         # a deployed board: this deploy copies nothing
    with vboard.VirtualBoard(tmp_path, heap=helpers.board_heap(mp), micropython=mp) as b:
        deploy.deploy(b.port, str(iris_checkpoint))
        user = b.flash / "data" / "user.csv"
        t = Term(b.port)
        t.paste(SENSOR)
        out = t.line("got = mf_capture.capture(s, lambda: next(it), 'versicolor', count=3, rate_hz=20); "
                     "print('N', s.num_examples(), len(got))")
        assert "N 3 3" in out, out
        rows = user.read_text().splitlines()
        assert rows == [HEADER, "5,3.4,1.5,0.2,versicolor", "6.7,3.1,4.4,1.4,versicolor",
                        "6.9,3.1,5.4,2.1,versicolor"], rows
        before = user.read_bytes()
        out = t.line("mf_capture.capture(s, lambda: [5.0, float('nan'), 1.5, 0.2], 'setosa')")
        _has(out, "NonFiniteError", "feature 2 (sepal_width) is nan")
        assert user.read_bytes() == before
        # a real Ctrl-C, typed while capture waits between readings (5 Hz, 50 examples: 10 s)
        t.drain(0.05)
        t.s.write(b"mf_capture.capture(s, slow, 'setosa', count=50, rate_hz=5, verbose=True)\r")
        seen = b""
        deadline = time.monotonic() + 30
        while b"example 3/50" not in seen:
            assert time.monotonic() < deadline, seen
            seen += t.s.read(4096)
        t.s.write(b"\x03")
        out = t.read_until(b">>> ", timeout=30)
        _has(out, "KeyboardInterrupt", "of 50; nothing written")
        assert re.search(r"capture: interrupted during example \d+ of 50; nothing written", out), out
        assert user.read_bytes() == before
        out = t.line("print('N', s.num_examples(), finetune.Session(verbose=False).num_examples())")
        assert re.search(r"N 3 3", out), out
        t.close()
