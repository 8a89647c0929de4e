"""board/finetune.py: the on-board REPL session, under CPython and inside real MicroPython.

tests/mp/finetune_session_mp.py holds the session checks; they run in both interpreters against
flash folders in tmp_path that hold what `make deploy` puts on the board (the `iris_flash`
fixture: model.mfck from host/tools/pretrain.py, data/iris.csv).
"""
import os
import subprocess

import pytest

import helpers
import bench_common as bench  # noqa: E402  (host/bench/ is on the path: helpers)
import finetune_session_mp


def test_session_cpython(tmp_path, iris_flash):
    r = finetune_session_mp.run(iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b"))
    finetune_session_mp.check(r)


def board_mpy(folder, exe):
    """board/*.py and lib/microformer/*.py compiled into `folder` for interpreter `exe` as `make
    deploy` compiles them for a board (host/bench/bench_common.py compiled_modules, through host/tools/deploy.py).
    Returns the MICROPYPATH that runs on them. Compiling the session and the library from source
    would take heap (and leave it fragmented) in a way a board never does."""
    return os.pathsep.join(bench.compiled_modules(exe, str(folder)) + [helpers.MP])


def run_board_script(script, args, heap, exe, path):
    """`script` under MicroPython `exe` with MICROPYPATH `path` (board_mpy's)."""
    env = dict(helpers.micropython_env(), MICROPYPATH=path)
    proc = subprocess.run([exe, "-X", "heapsize=" + heap, script] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=helpers.ROOT)
    assert proc.returncode == 0, "micropython failed (rc=%d):\n%s\n%s" % (
        proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def test_session_micropython(tmp_path, iris_flash, micropython):
    # a board without PSRAM's 512K heap (helpers.board_heap: more on the 64-bit stock port)
    heap = helpers.board_heap(micropython)
    out = run_board_script(helpers.script("finetune_session_mp.py"),
                           [iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b")], heap, micropython,
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


def test_refused_fit_changes_nothing(tmp_path, iris_flash):
    """fit(epochs=1, lr=1e30): the first steps are finite (weights of ~1e30), a later one is
    refused; the call is rolled back, so the test accuracy, the weights, Adam's state, the step
    count and lr are what they were. A refused argument changes nothing either."""
    import finetune
    import microformer as mf
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    acc = s.evaluate().accuracy
    s.fit(epochs=1, data="train")
    acc1 = s.evaluate().accuracy
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    moments = [bytes(t.data) for t in s._opt.m + s._opt.v]
    steps, lr = s._opt.steps, s.lr
    with pytest.raises(mf.NonFiniteError, match="rolled back"):
        s.fit(epochs=1, lr=1e30, data="train")
    assert s.evaluate().accuracy == acc1 and acc1 > 0.8 and acc > 0.8
    assert {k: bytes(p.data) for k, p in s.model.named_params()} == w
    assert [bytes(t.data) for t in s._opt.m + s._opt.v] == moments
    assert (s._opt.steps, s.lr, s._opt.lr) == (steps, lr, lr)
    with pytest.raises(ValueError, match="epochs must be an int >= 1, got -1"):
        s.fit(epochs=-1, lr=0.5)
    assert s.lr == lr and s._opt.lr == lr
    with pytest.raises(ValueError, match="epochs must be an int >= 1, got '5'"):
        s.fit(epochs="5")
    assert len(s.meta["history"]) == 1
    # on_error='keep': the good steps stay (the accuracy drops), and the fit is recorded
    with pytest.raises(mf.NonFiniteError, match="on_error='keep'"):
        s.fit(epochs=1, lr=1e30, data="train", on_error="keep")
    assert s.evaluate().accuracy < acc1
    assert s.meta["history"][-1]["error"].startswith("NonFinite") and s.meta["history"][-1]["steps"] >= 1


def test_fit_history_is_bounded(tmp_path, iris_flash, capsys):
    """The checkpoint keeps the records of the last fits and totals over all of them: the record
    list stops growing, the totals count every fit, a save and a new Session keep both."""
    import finetune
    a = iris_flash(tmp_path / "a")
    s = finetune.Session(root=a, verbose=False)
    pairs = [([5.1, 3.5, 1.4, 0.2], "setosa"), ([6.4, 3.2, 4.5, 1.5], "versicolor")]
    sizes = []
    for k in range(40):
        s.fit(epochs=2, data=pairs)
        sizes.append(len(s.meta["history"]))
    assert sizes[-1] == sizes[25] < 25, sizes
    assert s.meta["history"][-1]["epochs"] == 2
    tot = s.meta["fit_totals"]
    assert (tot["fits"], tot["epochs"], tot["steps"]) == (40, 80, 80), tot
    s.save()
    t = finetune.Session(root=a, verbose=False)
    assert t.meta["fit_totals"] == tot and len(t.meta["history"]) == sizes[-1]
    capsys.readouterr()
    t.info()
    assert "on-board fits: 40" in capsys.readouterr().out
    h = t.fit(epochs=300, data=pairs)
    assert h.epochs == h.steps == 300 and h[-1]["epoch"] == 300 and len(h) < 300
    assert [r["epoch"] for r in h] == list(range(301 - len(h), 301))


def test_fit_out_of_memory_names_its_cause(tmp_path, iris_flash, monkeypatch):
    """Out of memory while training: the message says so (with the steps done) and the call is
    rolled back; out of memory making the records after training: the message says the steps
    are done and kept, and the fit is recorded."""
    import finetune
    import mf_session
    from microformer import train
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    forward = s.model.forward
    s.model.forward = forward_failing(forward, 4, MemoryError)
    with pytest.raises(MemoryError) as e:       # the whole batch asked for: no smaller micro-batch tried
        s.fit(epochs=2, data="train", micro_batch=None)
    msg = str(e.value)
    assert "out of memory in fit, training" in msg, msg
    assert "0 of 2 epochs and 3 steps done" in msg and "rolled back" in msg, msg
    assert {k: bytes(p.data) for k, p in s.model.named_params()} == w
    assert s._opt is None           # as before the call: the optimizer it made is given back
    s.model.forward = forward

    def no_memory(self):
        raise MemoryError("memory allocation failed")
    monkeypatch.setattr(train.FitLog, "records", no_memory)
    steps = 0
    with pytest.raises(MemoryError) as e:
        s.fit(epochs=2, data="train")
    msg = str(e.value)
    assert "after training" in msg and "the 16 steps are done, kept by the model and recorded" in msg, msg
    assert s._opt.steps == steps + 16 and s.meta["history"][-1]["steps"] == 16
    assert {k: bytes(p.data) for k, p in s.model.named_params()} != w
    assert mf_session.FIT_KEEP_EPOCHS > 2


def forward_failing(forward, n, exc):
    calls = {"n": 0}

    def f(x):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return forward(x)
    return f


def test_fit_log_holds_room_for_the_epochs_it_keeps(tmp_path, iris_flash, monkeypatch):
    """A fit's per-epoch store has room for the records it keeps: every epoch of a fit shorter
    than FIT_KEEP_EPOCHS (one epoch: one record's room, not FIT_KEEP_EPOCHS'), the last
    FIT_KEEP_EPOCHS of a longer one; the FitResult holds the same records either way."""
    import finetune
    import mf_session
    from microformer import train
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    pairs = [([5.1, 3.5, 1.4, 0.2], "setosa"), ([6.4, 3.2, 4.5, 1.5], "versicolor")]
    made = []
    init = train.FitLog.__init__

    def spy(self, keep=None):
        made.append(keep)
        init(self, keep)
    monkeypatch.setattr(train.FitLog, "__init__", spy)
    keep = mf_session.FIT_KEEP_EPOCHS
    for epochs in (1, 3, keep + 5):
        h = s.fit(epochs=epochs, data=pairs)
        assert [r["epoch"] for r in h] == list(range(max(1, epochs - keep + 1), epochs + 1))
    assert made == [1, 3, keep], made
