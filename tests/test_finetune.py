"""board/finetune.py: the on-board REPL session, under CPython and inside real MicroPython.

tests/finetune_session_mp.py holds the session checks; they run in both interpreters against
flash folders in tmp_path that hold what `make deploy` puts on the board (the `iris_flash`
fixture: iris.mfck from host/pretrain.py, data/iris.csv).
"""
import pytest

import helpers
import finetune_session_mp


def test_session_cpython(tmp_path, iris_flash):
    r = finetune_session_mp.run(iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b"))
    finetune_session_mp.check(r)


def test_session_micropython(tmp_path, iris_flash, micropython):
    out = helpers.run_micropython(helpers.script("finetune_session_mp.py"), iris_flash(tmp_path / "a"),
                                  iris_flash(tmp_path / "b"), heap="512K", exe=micropython)
    assert "FINETUNE OK" in out, out


def test_module_imports_without_board_files():
    import finetune
    assert finetune.CHECKPOINT == "iris.mfck" and finetune.DATA == "data/iris.csv"
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
