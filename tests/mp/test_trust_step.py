"""The training step is all or nothing, on both backends and in both interpreters.

tests/mp/trust_step_mp.py holds the checks (runs under CPython and inside MicroPython): a NaN/inf
input, a NaN gradient, SGD diverging, a finite loss with an inf gradient and an Adam moment that
overflows each raise NonFiniteError with every weight, moment and the step counter bit for bit as
before; a KeyboardInterrupt at every kernel call of a step (before, after, or with the kernel's
output half written; and a second one during the recovery) leaves the state of the step before
or of the completed step, and one that lands during the optimizer's write is held and raised
after the step completes.
"""
import json

import pytest

import helpers

SCRIPT = helpers.script("trust_step_mp.py")


def _check(r):
    for tag, where in (("nan_input", "Sequential: example 1, feature 1 is nan"),
                       ("inf_input", "Sequential: example 1, feature 1 is inf"),
                       ("nan_grad", "the gradient of 0.W holds nan (element 3)"),
                       ("v_overflow", "non-finite")):
        assert r[tag].startswith("NonFiniteError: ") and where in r[tag], (tag, r[tag])
        assert r[tag + "_unchanged"], tag
    assert "Adam v of 5.W" in r["v_overflow"], r["v_overflow"]
    assert r["after_refusal_steps"] == 2 and r["after_refusal_finite"]
    for m in ("0", "0.9"):
        tag = "sgd_diverge_" + m
        # the step whose gradient or update overflows is refused (or the loss overflows first:
        # refused the same way, before any update)
        assert r[tag].startswith("NonFiniteError: SGD: step refused: ") or \
            r[tag].startswith("NonFiniteLossError: MSELoss: loss is not finite"), r[tag]
        assert r[tag + "_unchanged"] and r[tag + "_finite"], tag
        assert r[tag + "_steps"] >= 1, tag                     # it trained before it diverged
    # 3.6e77 is a finite double (the loss on a double-precision port) and inf as float32; the
    # viper kernels read the inf gradient as FLT_MAX: then the update's Adam v overflows
    assert r["inf_grad_unchanged"], r["inf_grad"]
    if r["huge_loss"] is None:                      # single-precision floats: the loss is inf
        assert r["inf_grad"].startswith("NonFiniteLossError: MSELoss: loss is not finite"), r["inf_grad"]
    elif r["backend"] == "python":
        assert 3.5e77 < r["huge_loss"] < 3.7e77
        assert "NonFiniteError: Adam: step refused: the gradient of 0.W holds inf" in r["inf_grad"], r["inf_grad"]
    else:
        assert "NonFiniteError: Adam: step refused: it would make Adam v of 0.W non-finite" in r["inf_grad"]

    for opt in ("adam", "sgd"):
        res = r["interrupt_" + opt]
        # one params_commit per group of tensors that fits the scratch (all 12 of this model)
        assert res["writes"] == 1 and res["calls"] > res["writes"], res
        assert res["other"] == [], (opt, res["other"])           # never a third state
        assert res["no_interrupt"] == [], (opt, res["no_interrupt"])
        assert res["write_not_completed"] == [], (opt, res["write_not_completed"])
        assert res["commit_not_completed"] == [], (opt, res["commit_not_completed"])
        assert res["commit_kernel"] == opt + "_step", res["commit_kernel"]
        assert res["pre"] > 0 and res["post"] > 0, res

    assert r["fit_hist"] == [[1, 2, True]], r["fit_hist"]
    assert r["fit_steps"] == 2 and r["fit_after_is_last_full_step"] and r["fit_differs_from_3"]

    # the step's scratch (new weights + Adam m + v of a group of tensors: all of this small model,
    # 4096 floats or the largest tensor for larger ones) is in the memory estimate
    assert r["params"] < 4096
    assert r["snapshot_floats"] == 3 * r["params"]
    assert r["state_floats"] == 2 * r["params"] + 3 * r["params"]
    assert r["summary"]["snapshot_bytes"] == 4 * r["snapshot_floats"]
    assert r["summary"]["param_bytes"] == 4 * r["params"] * 4 + r["summary"]["snapshot_bytes"]


HYPER = {
    "adam lr inf": "Adam: lr must be a finite number > 0.0, got inf",
    "adam lr nan": "Adam: lr must be a finite number > 0.0, got nan",
    "adam lr 0": "Adam: lr must be a finite number > 0.0, got 0",
    "sgd lr -1": "SGD: lr must be a finite number > 0.0, got -1.0",
    "adam beta1 1": "Adam: betas[0] must be a finite number in [0.0, 1.0), got 1.0",
    "adam beta2 nan": "Adam: betas[1] must be a finite number in [0.0, 1.0), got nan",
    "adam betas 3": "Adam: betas must be two numbers in [0, 1), got (0.9, 0.99, 0.9)",
    "adam eps 0": "Adam: eps must be a finite number > 0.0, got 0.0",
    "adam eps inf": "Adam: eps must be a finite number > 0.0, got inf",
    "adam wd inf": "Adam: weight_decay must be a finite number >= 0.0, got inf",
    "sgd wd -1": "SGD: weight_decay must be a finite number >= 0.0, got -1.0",
    "sgd momentum inf": "SGD: momentum must be a finite number in [0.0, 1.0), got inf",
    "sgd momentum 1": "SGD: momentum must be a finite number in [0.0, 1.0), got 1.0",
    "adam clip inf": "Adam: max_grad_norm must be a finite number > 0.0, got inf",
    "adam clip 0": "Adam: max_grad_norm must be a finite number > 0.0, got 0.0",
    "layernorm eps inf": "LayerNorm: eps must be a finite number > 0.0, got inf",
    "adam lr str": "Adam: lr must be a finite number > 0.0, got '0.1'",
    "adam set lr inf": "Adam: lr must be a finite number > 0.0, got inf",
}

# torch semantics: relu(nan) = nan, relu'(x) passes dout unless x <= 0 (so a NaN x passes it),
# leaky_relu' passes dout where x > 0 (else 0.01 dout); NaN dout stays NaN where it passes
ACTS_Y0 = {"relu", "leaky_relu", "gelu", "tanh", "sigmoid"}
RELU_DX = ["1.0", "nan", "0.0", "1.0", "0.0"]


def _check_common(r):
    assert abs(r["clip_norm"] / (2 ** 0.5 * 1e20) - 1) < 1e-5, r["clip_norm"]
    assert abs(r["clip_grads"][0] - 0.5 ** 0.5) < 1e-5 and abs(r["clip_grads"][1] + 0.5 ** 0.5) < 1e-5
    for name, want in HYPER.items():
        assert r["hyper"][name] == "ValueError: " + want, (name, r["hyper"][name])
    for kind, (y, dx) in r["acts"].items():
        assert y[0] == "nan", (kind, y)                 # NaN in, NaN out
        assert dx[1] == "nan", (kind, dx)               # NaN dout where the input is 2.0
    assert r["acts"]["relu"][0][:3] == ["nan", "2.0", "0.0"], r["acts"]["relu"]
    assert r["acts"]["relu"][1] == RELU_DX, r["acts"]["relu"]
    assert abs(float(r["acts"]["leaky_relu"][1][0]) - 0.01) < 1e-4, r["acts"]["leaky_relu"]
    assert r["acts"]["leaky_relu"][0][4] == "-inf", r["acts"]["leaky_relu"]


def test_step_cpython():
    import microformer as mf
    import trust_step_mp
    try:
        r = json.loads(json.dumps(trust_step_mp.run("python")))
    finally:
        mf.set_backend("python")
    _check(r)
    _check_common(r)


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_step_micropython(tmp_path, micropython, backend):
    out = tmp_path / "out.json"
    helpers.run_micropython(SCRIPT, backend, str(out), heap="4M", exe=micropython)
    r = json.loads(out.read_text())
    _check(r)
    _check_common(r)


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_sigint_during_training_keeps_full_steps(micropython, backend):
    """30 real SIGINTs at random moments of a training loop: each one stops it after a whole step
    (the loop goes on from the step counter); the final weights and moments equal an
    uninterrupted replay of that many steps, bit for bit."""
    import random
    import signal
    import subprocess
    import time
    if micropython == helpers.interpreter_path("stock"):
        pytest.skip("the stock unix port raises KeyboardInterrupt from inside its signal handler "
                    "(MICROPY_ASYNC_KBD_INTR): a SIGINT during a garbage collection leaves the heap "
                    "locked ('heap is locked'), before any Python code runs; the mp32 port schedules "
                    "it as an ESP32 does")
    n = 30
    env = helpers.micropython_env()
    p = subprocess.Popen([micropython, "-X", "heapsize=2M", helpers.script("sigint_mp.py"),
                          backend, str(n)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, cwd=helpers.ROOT)
    try:
        assert p.stdout.readline().strip() == "READY"
        rng = random.Random(backend)
        gap = 0.05 if backend == "viper" else 0.3             # a few steps between interrupts
        seen = []
        for _ in range(n):
            time.sleep(rng.uniform(0.0, gap))
            p.send_signal(signal.SIGINT)
            line = p.stdout.readline()
            assert line.startswith("KI "), line + p.stdout.read()
            seen.append(line)
        out = p.communicate(timeout=300)[0]
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
    last = out.strip().splitlines()[-1]
    steps = int(last.split()[2])
    assert last == "RESULT steps %d interrupts %d other 0 same 1" % (steps, n), out
    assert steps >= 2, seen                                    # it trained between interrupts
