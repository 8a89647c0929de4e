"""A fine-tune that keeps what the model knew: microformer.guard (rehearsal sampling, validation,
best epoch, rollback, divergence) and the session's fit on the user's examples (board/mf_guard.py),
on a model and data of their own (board/benchmarks/bench_guard.py: a 3-class attention classifier over
windows of 4 x 3 readings, 40 test rows, 5 examples of a class read by a shifted sensor).
tests/mp/guard_mp.py holds the guard's checks; both run under CPython and inside MicroPython.
"""
import json
import os

import helpers
import guard_mp

BENCH = os.path.join(helpers.ROOT, "board", "benchmarks", "bench_guard.py")


def test_guard_cpython():
    guard_mp.check(guard_mp.run())


def test_guard_micropython(micropython):
    out = helpers.run_micropython(helpers.script("guard_mp.py"), heap="1M", exe=micropython)
    assert "GUARD OK" in out, out


def _goals(r):
    # default fit: the base test split loses at most one of its 40 rows, >= 4 of the 5 examples
    # are then right; fit(lr=50): rolled back, the test accuracy as before
    d = r["default"]
    assert r["n_test"] == 40 and r["n_user"] == 5, r
    assert d["test_before"] == r["test_before"] and d["test"] >= d["test_before"] - 1, r
    assert d["user"] >= 4 and r["user_before"] <= 1, r
    lr = r["lr50"]
    assert lr["guard"] == "rollback" and lr["test"] == lr["test_before"], r


def test_default_fit_keeps_the_base_cpython(tmp_path, capsys):
    import bench_guard
    r = bench_guard.run(str(tmp_path), 1)
    _goals(r)
    out = capsys.readouterr().out
    assert "fit: diverged at epoch 1" in out and "lr 50 is too high for this model: try fit(lr=5)" in out, out


def test_default_fit_keeps_the_base_micropython(tmp_path, micropython):
    out = helpers.run_micropython(BENCH, str(tmp_path), "2", heap="4M", exe=micropython)
    line = [s for s in out.splitlines() if s.startswith("GUARD ")]
    assert line, out
    _goals(json.loads(line[0][6:]))


def test_fit_line_says_what_and_why(tmp_path, capsys):
    import bench_guard
    import finetune
    pairs = bench_guard.make_flash(str(tmp_path), 3)
    s = finetune.Session(root=str(tmp_path), verbose=False)
    s.add_examples(pairs)
    s.verbose = True
    capsys.readouterr()
    h = s.fit(epochs=2)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fit on your 5 examples in "), out[0]
    for part in ("20 rows of the training split replayed beside them (rehearse=4 per example",
                 "validated after every epoch on 40 test rows + your 5 examples (trained on",
                 "a fit leaving validation worse by more than 2.5 points is rolled back",
                 ": 25 examples, 2 epochs"):
        assert part in out[0], (part, out[0])
    assert any(line.startswith("fit: kept epoch ") or "rolled back" in line for line in out), out
    assert s.meta["history"][-1]["guard"] == h["guard"]
    # data='train' asks for the pretraining split: no rehearsal, no validation
    capsys.readouterr()
    s.fit(epochs=1, data="train")
    out = capsys.readouterr().out
    assert "replayed" not in out and "validated" not in out, out


def test_guard_arguments_refused_before_anything_changes(tmp_path):
    import bench_guard
    import finetune
    import pytest
    pairs = bench_guard.make_flash(str(tmp_path), 4)
    s = finetune.Session(root=str(tmp_path), verbose=False)
    s.add_examples(pairs)
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    for kw, msg in (({"on_worse": "never"}, "on_worse must be one of 'rollback', 'keep', got 'never'"),
                    ({"rehearse": -1}, "rehearse (base rows replayed per user example) must be a number"),
                    ({"tol": 2}, "tol must be a number in [0, 1], got 2")):
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            s.fit(**kw)
    assert {k: bytes(p.data) for k, p in s.model.named_params()} == w and s._opt is None


def test_ctrl_c_in_a_guarded_fit_keeps_the_last_full_step(tmp_path, capsys):
    # Ctrl-C during a guarded fit: no epoch is chosen, no rollback; the weights of the last full
    # step stay (the guard would have put back epoch weights or the state from before)
    import bench_guard
    import finetune
    pairs = bench_guard.make_flash(str(tmp_path), 5)
    s = finetune.Session(root=str(tmp_path), verbose=False)
    s.add_examples(pairs)
    w0 = {k: bytes(p.data) for k, p in s.model.named_params()}
    calls = {"n": 0, "w": None}
    forward = s.model.forward

    def interrupting_forward(x):
        calls["n"] += 1
        if x.shape[0] == 9 and calls["w"] is None:         # a 9-row batch: the guard's start, then a step
            if calls.get("seen9"):
                calls["w"] = {k: bytes(p.data) for k, p in s.model.named_params()}
                raise KeyboardInterrupt
            calls["seen9"] = True
        return forward(x)

    s.model.forward = interrupting_forward
    s.verbose = True
    h = s.fit(epochs=5)
    out = capsys.readouterr().out
    s.model.forward = forward
    assert h["interrupted"] and h["guard"] == "interrupted", (h, out)
    assert "fit: interrupted: the guard chose no epoch" in out and "rolled back: the weights" not in out, out
    now = {k: bytes(p.data) for k, p in s.model.named_params()}
    assert now == calls["w"] and now != w0


def test_rollback_without_the_sessions_copy_says_what_it_put_back(tmp_path, capsys):
    # on_error='keep' keeps no copy of the optimizer state: a guard rollback puts back the weights
    # from its own copy and says that the optimizer's moments are this fit's
    import bench_guard
    import finetune
    pairs = bench_guard.make_flash(str(tmp_path), 6)
    s = finetune.Session(root=str(tmp_path), verbose=False)
    s.add_examples(pairs)
    w0 = {k: bytes(p.data) for k, p in s.model.named_params()}
    h = s.fit(lr=50, on_error="keep", verbose=False)
    out = capsys.readouterr().out
    assert h["guard"] == "rollback", out
    assert "rolled back: the weights are those from before this call (with on_error='keep'" in out, out
    assert {k: bytes(p.data) for k, p in s.model.named_params()} == w0
