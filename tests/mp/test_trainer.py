"""The trainer in lib (microformer.train.Trainer) and the session's fit over it: micro-batches
whose gradients add up to the batch's (against the one-batch run and PyTorch), no input gradient
nobody reads, the memory plan against the heap a step leaves, a failed fit that gives its memory
back, and a rolled-back session fit that leaves the session as it was. tests/mp/trainer_mp.py
runs the same checks inside both MicroPython ports."""
import re

import pytest

import helpers

SCRIPT = helpers.script("trainer_mp.py")


def _micro_rows(out):
    rows = re.findall(r"^MICRO (\w+) (\d+) (\S+) (\S+)$", out, re.M)
    assert len(rows) >= 4, out
    return [(opt, int(r), float(d), float(big)) for opt, r, d, big in rows]


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_micro_batches_add_up_to_the_batch_cpython(backend):
    # float32 sums in another order: a few ulps of the weights after two steps
    for opt, rows, d, big in _micro_rows(helpers.run_cpython(SCRIPT, "micro", backend)):
        assert d <= 1e-5 * big, (opt, rows, d, big)


def test_micro_batches_add_up_to_the_batch_micropython(micropython):
    # viper's block floats: each micro-batch's GEMMs round at their own block maxima
    for opt, rows, d, big in _micro_rows(helpers.run_micropython(SCRIPT, "micro", exe=micropython, heap="8M")):
        assert d <= 1e-4 * big, (opt, rows, d, big)


def test_micro_batches_match_pytorch():
    """Two SGD steps (momentum; unlike Adam's, its step scales with the gradient) of a
    Dense-ReLU-Dense classifier in micro-batches of 3 against PyTorch's over the whole batch of 12."""
    from torch_compare import close, to_mf, torch
    import microformer as mf
    from microformer.data import Dataset
    from microformer.train import Trainer
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = mf.Sequential([mf.Dense(5, 16), mf.ActivationLayer("relu"), mf.Dense(16, 3)])
    model.load_state_dict(net.state_dict())
    X = torch.randn(12, 5)
    y = torch.tensor([i % 3 for i in range(12)])
    topt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        topt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), y).backward()
        topt.step()
    ds = Dataset(to_mf(X), [int(v) for v in y], ["a", "b", "c"], ["f%d" % i for i in range(5)])
    t = Trainer(model, mf.CrossEntropyLoss(), mf.SGD(model, lr=0.1, momentum=0.9), batch_size=12, micro_batch=3)
    for _ in range(2):
        X_, y_ = next(iter(_Whole(ds)))
        t.step(X_, y_)
    for name, want in net.state_dict().items():
        close(model.state_dict()[name], want, name, tol=1e-5)


class _Whole:
    # the data set as one batch in its own order (PyTorch's steps saw it so)
    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        yield self.ds.X, list(self.ds.y)


def _calls(out):
    m = re.search(r"^CALLS (\d+) (\d+)$", out, re.M)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def _sequential_calls_per_step():
    # matmul_backward_input calls of one train_step of Iris's Sequential (the reference path)
    import microformer as mf
    from microformer.train import train_step
    model = mf.models.iris_model()
    n = [0]
    K = mf.backend.K
    f = K.matmul_backward_input

    def counted(*a):
        n[0] += 1
        return f(*a)
    K.matmul_backward_input = counted
    try:
        train_step(model, mf.CrossEntropyLoss(), mf.Adam(model), mf.Tensor((8, 4)), [0] * 8)
    finally:
        K.matmul_backward_input = f
    return n[0]


def test_session_fit_computes_no_unused_input_gradient(tmp_path, iris_flash, monkeypatch):
    """Session.fit makes as many matmul_backward_input calls per step as Sequential's own
    training step: the first Dense's input gradient (nobody reads it) is not computed."""
    import finetune
    import microformer as mf
    per_step = _sequential_calls_per_step()
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    n = [0]
    K = mf.backend.K
    f = K.matmul_backward_input

    def counted(*a):
        n[0] += 1
        return f(*a)
    monkeypatch.setattr(K, "matmul_backward_input", counted)
    r = s.fit(epochs=1, data="train")
    assert r["steps"] > 1 and n[0] == per_step * r["steps"], (n[0], per_step, r["steps"])


def test_trainer_computes_no_unused_input_gradient(micropython):
    n, steps = _calls(helpers.run_micropython(SCRIPT, "calls", exe=micropython, heap="4M"))
    assert steps == 2 and n == steps * _sequential_calls_per_step(), (n, steps)


@pytest.mark.parametrize("case", [("conv", 16, 16), ("conv", 16, 4), ("encoder", 8, 8), ("encoder", 8, 2)],
                         ids=lambda c: "%s-%d-micro%d" % c)
def test_plan_is_within_ten_percent_of_the_heap_a_step_leaves(micropython, case):
    """The plan's activations and batch rows against the live heap a fit leaves beyond the
    optimizer (gc.mem_alloc after gc.collect), on the port's own object sizes."""
    out = helpers.run_micropython(SCRIPT, "plan", *case, exe=micropython, heap="16M")
    m = re.search(r"^PLAN (\d+) (\d+)$", out, re.M)
    assert m, out
    need, measured = int(m.group(1)), int(m.group(2))
    assert abs(need - measured) <= 0.10 * measured, (need, measured)


def test_a_failed_fit_gives_its_memory_back(micropython):
    out = helpers.run_micropython(SCRIPT, "release", exe=micropython, heap="8M")
    assert "NO FAILURE" not in out, out
    m = re.search(r"^RELEASE (-?\d+)$", out, re.M)
    assert m, out
    assert int(m.group(1)) <= 1024, out


def test_a_refused_auto_fit_drops_the_optimizer_it_made(micropython):
    """fit(micro_batch='auto') makes the optimizer's blocks before it picks the micro-batch; when
    not even one row fits, the refusal drops them again: no optimizer, the heap within 1 KB, and
    the next fit runs."""
    out = helpers.run_micropython(SCRIPT, "refuse", exe=micropython, heap="4M")
    assert "REFUSED True" in out and "OPTIMIZER True" in out and "FITTED 1" in out, out
    m = re.search(r"^KEPT (-?\d+)$", out, re.M)
    assert m and int(m.group(1)) <= 1024, out


def test_a_rolled_back_session_fit_leaves_the_session_as_it_was(tmp_path, iris_flash):
    """A fit that fails at its first step: the weights, no optimizer (none before), the fit
    count, lr and the fitted-and-unsaved flag as before, so s.lora() still works."""
    import finetune
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    before = (s._opt, s._fits, s._dirty, s.lr)
    forward = s.model.forward
    s.model.forward = _failing(forward)
    with pytest.raises(MemoryError) as e:
        s.fit(epochs=1, data="train", lr=0.05)
    assert "rolled back" in str(e.value)
    s.model.forward = forward
    assert {k: bytes(p.data) for k, p in s.model.named_params()} == w
    assert (s._opt, s._fits, s._dirty, s.lr) == before
    assert s.lora(rank=2)                 # refused after a fit that changed the weights


def _failing(forward):
    def f(x):
        raise MemoryError("memory allocation failed")
    return f


@pytest.mark.mp32
def test_the_out_of_memory_message_names_a_micro_batch_that_then_works(tmp_path, iris_flash):
    """32-bit port: a batch of 120 in one piece does not fit a 420K heap; the message names a
    micro-batch from the plan, the heap is back within 1 KB, and a fit with that micro-batch runs."""
    exe = helpers.need_interpreter("mp32")
    out = helpers.run_micropython(helpers.script("trainer_oom_mp.py"), iris_flash(tmp_path / "f"),
                                  exe=exe, heap="420K")
    assert "OOM s.fit(micro_batch=" in out, out
    m = re.search(r"^KEPT (-?\d+)$", out, re.M)
    assert m and int(m.group(1)) <= 1024, out
    assert "FLAGS True" in out and "RETRY ok" in out, out


def test_auto_micro_batches_halve_on_a_memory_error():
    """micro_batch='auto': a MemoryError inside a step (a heap too fragmented for what the plan
    counted) halves the micro-batch and runs the batch again, saying so; the weights are those of
    a fit in the smaller micro-batches from the start. Without 'auto' the error goes up."""
    import microformer as mf
    from trainer_mp import _data, _model
    from microformer.train import Trainer

    def run(micro, fail):
        model, shape, C = _model()
        t = Trainer(model, mf.CrossEntropyLoss(), mf.SGD(model, lr=0.05), batch_size=12, input_shape=shape)
        if fail:
            forward = model.forward
            calls = [0]

            def f(x):
                calls[0] += 1
                if calls[0] == 2:            # the whole batch's forward of the second step
                    raise MemoryError("memory allocation failed")
                return forward(x)
            model.forward = f
        t.fit(_data(shape, C, 36), epochs=1, micro_batch=micro, verbose=False)
        return t, [bytes(p.data) for p, _ in model.params()]
    t, got = run("auto", True)
    assert t.last_rows == 6
    _, first_whole = run(12, False)
    assert got != first_whole
    with pytest.raises(MemoryError):
        run(12, True)


def test_a_session_fit_halves_its_micro_batch_on_a_memory_error(tmp_path, iris_flash):
    """The session chooses its micro-batch itself (Trainer.choose_micro) and passes it on: with
    micro_batch='auto' (its default) a MemoryError inside a step still halves it (Trainer.fit
    shrink=True) instead of failing the fit; with an explicit micro-batch the error goes up."""
    import finetune

    def failing_once(model):
        forward = model.forward
        calls = [0]

        def f(x):
            calls[0] += 1
            if calls[0] == 2:
                raise MemoryError("memory allocation failed")
            return forward(x)
        model.forward = f
        return forward

    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    forward = failing_once(s.model)
    r = s.fit(epochs=1, data="train")
    assert r["steps"] > 1 and s._trainer.last_rows == s.batch_size // 2, (r["steps"], s._trainer.last_rows)
    s.model.forward = forward
    failing_once(s.model)
    with pytest.raises(MemoryError):
        s.fit(epochs=1, data="train", micro_batch=None)


def test_session_plan_is_the_sum_of_its_parts(tmp_path, iris_flash, capsys):
    """s.plan(): the parts and the peak of a fit step (CPython: the layers' declared activations,
    said as such), the rollback copy counted, more activations for a larger batch."""
    import finetune
    s = finetune.Session(root=iris_flash(tmp_path / "a"), verbose=False)
    p = s.plan(verbose=True)
    assert "memory plan, batch 16 in micro-batches of 16" in capsys.readouterr().out
    parts = ("weights", "grads", "optimizer", "snapshot", "activations", "batch_rows")
    assert p["peak"] == sum(p[k] for k in parts) and p["how"] == "declared"
    n = s.model.param_count()
    assert p["weights"] == 4 * n and p["optimizer"] == 4 * 5 * n and p["snapshot"] == 4 * 3 * n
    assert s.plan(batch_size=32, verbose=False)["activations"] > p["activations"]
    assert s.plan(micro_batch=4, verbose=False)["activations"] < p["activations"]
