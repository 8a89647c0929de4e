"""A smaller start for a fine-tune session (tests/mp/session_start_mp.py): `import finetune` and a
session that loads, fits and evaluates leave the rarer modules unloaded (the drift demo, the
session's other commands, the viper kernels and layers Iris does not use), and each resolves on
first use; on MicroPython the modules only its load needed (spec, specformat, specplan; checkpoint
once its part of the load succeeded) and fit's memory plan (memplan) are gone once they are done; a lazy board module that fails to import says which one and why; and the session runs
in the heap `make bench` reports for the 32-bit port (host/bench/bench_common.py smallest_session_heap), so a
change that makes it need more fails here."""
import os
import shutil
import subprocess
import sys

import pytest

import helpers
from test_finetune import board_mpy, run_board_script

# The smallest -X heapsize (KB) from which every larger one ran the bench's session on the 32-bit
# port, measured with host/bench/bench_common.py smallest_session_heap (mpy=True: the modules compiled as
# `make deploy` sends them; mpy=False: the .py sources), plus a few KB: where arrays land moves
# with any change to the code and with the paths the modules come from (a run from another folder
# needed up to 10 KB more), so a margin keeps this about the need, not the layout.
HEAP_MPY_KB = 202
HEAP_PY_KB = 234
MARGIN_KB = 14


def _lines(out, tag):
    return [l.split(" ", 1)[1] for l in out.splitlines() if l.startswith(tag + " ")]


def _check_loaded(out):
    assert _lines(out, "LOADED") == ["import []", "session []"], out
    # MicroPython drops what only the load needed (mf_session.LOAD_ONLY); CPython keeps it
    assert _lines(out, "LOADONLY") in (["micropython []"], ["cpython ['mf_load', 'microformer.csvfile', 'microformer.spec', "
                                                           "'microformer.specformat', 'microformer.specplan']"]), out
    # and what only a successful load needs (checkpoint, meta) and fit's memory plan once it chose
    assert _lines(out, "AFTERLOAD") in (["micropython []"],
                                        ["cpython ['microformer.checkpoint', 'microformer.meta']"]), out
    assert _lines(out, "SAME") == ["True True True True True"], out
    # the Iris model's parts: Dense W b, in_proj weight and bias, out_proj weight and bias, head W b
    assert _lines(out, "METHODS") == ["True 16 True [] 8"], out
    assert _lines(out, "ATTR") == ["True"], out
    # the spec's checks (specplan) are gone before the model is built from the spec, on MicroPython
    assert _lines(out, "ATSPEC") in (["micropython [['microformer.checkpoint', 'microformer.meta']]"],
                                     ["cpython [['microformer.checkpoint', 'microformer.meta', "
                                      "'microformer.specplan']]"]), out
    # a failed load's CheckpointError is caught by `except mf.CheckpointError`
    assert _lines(out, "CAUGHT") == ["True"], out
    # and one that fails on the metadata after the data is read raises the class microformer.meta names
    assert _lines(out, "CAUGHTMETA") == ["True True"], out


def test_plain_session_leaves_the_rarer_modules_for_later(tmp_path, iris_flash, micropython):
    out = helpers.run_micropython(helpers.script("session_start_mp.py"), iris_flash(tmp_path / "f"),
                                  exe=micropython, heap="2M")
    _check_loaded(out)


def test_plain_session_leaves_the_rarer_modules_for_later_cpython(tmp_path, iris_flash):
    _check_loaded(helpers.run_cpython(helpers.script("session_start_mp.py"), iris_flash(tmp_path / "f")))


_BROKEN = """
import sys
import finetune
try:
    finetune.demo
except ImportError as e:
    print("DEMO", e)
s = finetune.Session(root=sys.argv[1], verbose=False)
try:
    s.predict([5.1, 3.5, 1.4, 0.2])
except ImportError as e:
    print("EXTRA", e)
"""


def _broken_run(tmp_path, iris_flash, exe):
    # board files where mf_demo.py and mf_commands.py fail to import (a name they import is missing);
    # exe None: CPython
    board = tmp_path / "board"
    shutil.copytree(helpers.BOARD, str(board))
    for name in ("mf_demo.py", "mf_commands.py"):
        p = board / name
        p.write_text("from mf_examples import no_such_function\n" + p.read_text())
    script = tmp_path / "broken.py"
    script.write_text(_BROKEN)
    path = os.pathsep.join([str(board), helpers.LIB])
    if exe:
        cmd = [exe, "-X", "heapsize=2M"]
        env = dict(os.environ, MICROPYPATH=path)
    else:
        cmd = [sys.executable]
        env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(cmd + [str(script), iris_flash(tmp_path / "f")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    demo = _lines(proc.stdout, "DEMO")
    extra = _lines(proc.stdout, "EXTRA")
    assert len(demo) == 1 and demo[0].startswith("mf_demo (for finetune.demo) failed to import: "), proc.stdout
    assert "no_such_function" in demo[0], proc.stdout
    assert len(extra) == 1 and extra[0].startswith("mf_commands (the session's commands beyond fit and "
                                                   "evaluate) failed to import: "), proc.stdout
    assert "no_such_function" in extra[0], proc.stdout


def test_a_lazy_board_module_that_fails_to_import_says_which(tmp_path, iris_flash, micropython):
    _broken_run(tmp_path, iris_flash, micropython)


def test_a_lazy_board_module_that_fails_to_import_says_which_cpython(tmp_path, iris_flash):
    _broken_run(tmp_path, iris_flash, None)


def _session_runs(exe, path, flash, kb):
    proc = subprocess.run([exe, "-X", "heapsize=%dK" % kb, "-c", "import bench; bench.session(%r)" % flash],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MICROPYPATH=path), cwd=flash)
    return proc.returncode == 0 and "SESSION ok " in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.mp32
@pytest.mark.parametrize("mpy", [True, False], ids=["mpy", "py"])
def test_session_runs_in_the_heap_the_bench_reports(tmp_path, iris_flash, mpy):
    exe = helpers.need_interpreter("mp32")
    flash = iris_flash(tmp_path / "f")
    if mpy:
        path = board_mpy(tmp_path / "mpy", exe)       # as make deploy compiles them
        kb = HEAP_MPY_KB
    else:
        path = os.pathsep.join(helpers.BOARD_PATH + [helpers.LIB])
        kb = HEAP_PY_KB
    for size in range(kb + MARGIN_KB, kb + MARGIN_KB + 25, 3):
        ok, out = _session_runs(exe, path, flash, size)
        assert ok, "the session no longer runs in a %d KB heap (%s; the bench measured it from %d KB):\n%s" % (
            size, "modules compiled to .mpy" if mpy else ".py sources", kb, out)
    # and the bound is near the need: far below it the session runs out of memory
    ok, out = _session_runs(exe, path, flash, kb * 3 // 4)
    assert not ok and "MemoryError" in out, out


@pytest.mark.parametrize("heap", ["448K", "2M"])
def test_loading_collects_every_sixteenth_of_a_small_heap(tmp_path, iris_flash, micropython, heap):
    """Session() collects every 1/16 of the heap while it loads (a small heap: cheap collections,
    fewer holes among what it keeps), at most every 32 KB (a PSRAM heap), then puts the threshold
    back."""
    out = helpers.run_micropython(helpers.script("session_gc_mp.py"), iris_flash(tmp_path / "f"),
                                  exe=micropython, heap=heap)
    total = int(_lines(out, "HEAP")[0])
    first = int(_lines(out, "SET")[0].split()[0])
    assert first == min(32768, total // 16), out
    assert _lines(out, "AFTER") == ["True"], out


_CONTIGUOUS = """
import gc
import finetune
gc.collect()
free = gc.mem_free()
try:
    b = bytearray(free * 9 // 10)
    print("BLOCK ok", free)
except MemoryError:
    print("BLOCK fails", free)
"""


@pytest.mark.parametrize("heap", ["512K", "1M"])
def test_import_leaves_the_free_heap_in_one_piece(tmp_path, micropython, heap):
    # `import finetune` (microformer and the session's modules, compiled to .mpy as `make deploy`
    # sends them) collects while it imports (tensor.settle_gc): nine tenths of the free heap after
    # it are one block (without: four fifths in 512K on the 32-bit port, a third in 200K)
    p = tmp_path / "contiguous.py"
    p.write_text(_CONTIGUOUS)
    out = run_board_script(str(p), [], heap, micropython, board_mpy(tmp_path / "mpy", micropython))
    assert "BLOCK ok" in out, out
