"""Eight torch models with their own forward (tests/fx_models.py), converted by graph capture
(host/tools/torch_fx.py through torch_io): each computes what torch computes (forward <= 1e-5 on the
portable and NumPy backends; the gradients of every parameter by its torch name and of the input),
keeps the module's state_dict names, round-trips through a checkpoint back into the user's own
class (load_into, and the CLI both ways), and runs on both MicroPython ports."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fx_models
import helpers
import microformer as mf
from torch_compare import close, torch
import torch_io  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")
CASES = fx_models.CASES


def _models(tmp_path):
    return helpers.user_module(tmp_path, "gesture_models", fx_models.MODELS_PY)


def _case(tmp_path, case, seed=1):
    cls, make_x, to_mf, shape, softmax = CASES[case]
    path, mod = _models(tmp_path)
    torch.manual_seed(seed)                     # torch's initial weights: the same in every run
    tm = fx_models.randomize(torch, getattr(mod, cls)(), seed)
    x = make_x(torch, torch.Generator().manual_seed(seed + 1))
    return path, mod, tm, x


def _mf_in(case, x):
    return mf.Tensor.from_list(CASES[case][2](x).tolist())


def _probs(y):
    a = np.asarray(y.data if isinstance(y, mf.Tensor) else y, dtype=np.float64).reshape(y.shape)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _want(case, tm, x):
    with torch.no_grad():
        return tm(x)


def _got(case, y):
    # the model's output as torch's: logits where torch ends with a softmax (it is left out)
    return _probs(y) if CASES[case][4] else y


@pytest.mark.parametrize("case", sorted(CASES))
def test_converts_and_computes_what_torch_computes(tmp_path, backend, case):
    _, _, tm, x = _case(tmp_path, case)
    model = torch_io.from_torch(tm).eval()
    assert isinstance(model, mf.graph.NamedSequential)
    close(_got(case, model(_mf_in(case, x))), _want(case, tm, x), case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_keeps_the_modules_state_dict_names(tmp_path, case):
    _, _, tm, _ = _case(tmp_path, case)
    model = torch_io.from_torch(tm)
    assert sorted(model.state_dict()) == sorted(tm.state_dict())
    spec = mf.to_spec(model)
    assert mf.spec.same_architecture(mf.to_spec(mf.from_spec(spec)), spec)


def _grads_by_name(model):
    g = {}
    for p, d in model.params():
        g[id(p)] = d
    out = {}
    for name, parts in model.state_parts():
        out[name] = np.concatenate([np.asarray(g[id(p)].data, dtype=np.float64) for p in parts])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_gives_torchs_gradients(tmp_path, backend, case):
    # training runs through every layer the forward maps to: the gradient of each parameter (by its
    # torch name) and of the input, for one upstream gradient, as torch computes them
    _, _, tm, x = _case(tmp_path, case, seed=3)
    model, conv = torch_io._from_torch(tm)
    model.eval()
    if CASES[case][4]:                       # the softmax is left out: compare below it
        tm.forward = _without_softmax(tm)
    xt = x.clone().float().requires_grad_(x.dtype.is_floating_point)
    y = tm(xt if x.dtype.is_floating_point else x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(9))
    tm.zero_grad()
    (y * dy).sum().backward()
    ym = model(_mf_in(case, x))
    close(ym, y.detach(), case + " forward")
    for p, d in model.params():
        d.data[:] = mf.Tensor.zeros(d.shape).data
    dx = model.backward(mf.Tensor.from_list(dy.tolist()), True, True)
    got = _grads_by_name(model)
    # (the Linear after a flatten of [B, C, L] has its columns in microformer's order)
    got = torch_io._permute({k: torch.tensor(v).reshape(tm.state_dict()[k].shape) for k, v in got.items()},
                            conv.perms, inverse=True)
    for name, p in tm.named_parameters():
        close(got[name], p.grad, "%s: d %s" % (case, name))
    if x.dtype.is_floating_point:
        close(np.asarray(dx.data).reshape(dx.shape), CASES[case][2](xt.grad), case + " dx")


def _without_softmax(tm):
    # the module's forward up to its softmax: the converted model's output
    import types
    gm = torch.fx.symbolic_trace(tm)
    for n in gm.graph.nodes:
        if n.op == "call_method" and n.target == "softmax":
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
    gm.recompile()
    return types.MethodType(lambda self, x: gm(x), tm)


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_into_the_users_own_class(tmp_path, case):
    _, mod, tm, x = _case(tmp_path, case)
    model, conv = torch_io._from_torch(tm)
    ck = tmp_path / "m.mfck"
    mf.checkpoint.save(str(ck), model, {"spec": mf.to_spec(model)})
    back = getattr(mod, CASES[case][0])()
    assert torch_io.load_into(back, str(ck)) is back
    for k, v in tm.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # and the module's own load_state_dict takes the converted model's state_dict as it is (but
    # for a Linear after a flatten of [B, C, L], whose columns load_into puts back in torch's order)
    if conv.perms:
        assert case == "conv-flatten" and list(conv.perms) == ["fc.weight"]
        return
    again = getattr(mod, CASES[case][0])()
    again.load_state_dict({k: torch.tensor(v.tolist()) for k, v in mf.load_model(str(ck)).state_dict().items()},
                          strict=True)
    close(again.eval()(x), _want(case, tm, x), case + " via load_state_dict")


def _cli(*args):
    return subprocess.run([sys.executable, TORCH_IO] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow           # (each of its four commands starts torch: 50 to 75 s on 2 busy cores)
@pytest.mark.parametrize("case", ["gesture", "token-lm"])
def test_cli_both_ways(tmp_path, case):
    path, mod, tm, x = _case(tmp_path, case)
    cls, _, _, shape, _ = CASES[case]
    pt = tmp_path / "mine.pt"
    torch.save(tm.state_dict(), pt)
    ck = tmp_path / "mine.mfck"
    args = ["--input-shape", "%d,%d" % tuple(shape)] if shape else []
    r = _cli(pt, "--model", "%s:%s" % (path, cls), "--out", ck, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    model = mf.load_model(str(ck)).eval()
    close(model(_mf_in(case, x)), _want(case, tm, x), case + " from the CLI's checkpoint")
    out = tmp_path / "back.pt"
    r = _cli(ck, "--model", "%s:%s" % (path, cls), "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    sd = torch.load(out, weights_only=True)
    assert list(sd) == list(tm.state_dict())
    for k, v in tm.state_dict().items():
        assert torch.equal(sd[k], v), k


def test_the_sequential_path_and_the_graph_give_the_same_model(tmp_path):
    # where both apply (a module whose forward is a chain of known modules) the layers, the
    # weights and the outputs agree; only the names differ (the module's own vs the indices)
    from torch import nn

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(3, 4, 3, padding=1)
            self.b = nn.ReLU()
            self.c = nn.MaxPool1d(2)
            self.d = nn.Flatten()
            self.e = nn.Linear(4 * 5, 2)

        def forward(self, x):
            return self.e(self.d(self.c(self.b(self.a(x)))))

    tm = fx_models.randomize(torch, Chain(), 4)
    seq = nn.Sequential(tm.a, tm.b, tm.c, tm.d, tm.e)
    g, s = torch_io.from_torch(tm), torch_io.from_torch(seq)
    gs, ss = mf.to_spec(g), mf.to_spec(s)
    assert [l["type"] for l in gs["layers"]] == [l["type"] for l in ss["layers"]]
    assert mf.spec.same_architecture(dict(gs["layers"][4]), dict(ss["layers"][4]))
    for (kg, vg), (ks, vs) in zip(g.state_dict().items(), s.state_dict().items(), strict=True):
        assert kg.split(".")[-1] == ks.split(".")[-1] and list(vg.data) == list(vs.data), (kg, ks)
    x = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(1))
    close(g(mf.Tensor.from_list(x.transpose(1, 2).tolist())), tm(x), "graph")


def _torch_grads(case, tm, x, conv, seed=9):
    # torch's output, input gradient and parameter gradients (in microformer's column order) for dy
    if CASES[case][4]:
        tm.forward = _without_softmax(tm)
    xt = x.clone().float().requires_grad_(True) if x.dtype.is_floating_point else x
    y = tm(xt)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
    tm.zero_grad()
    (y * dy).sum().backward()
    grads = torch_io._permute({n: p.grad for n, p in tm.named_parameters()}, conv.perms)
    dx = CASES[case][2](xt.grad) if x.dtype.is_floating_point else None
    return y.detach(), dy, dx, grads


# the models whose backward runs through graph.py's layers (a residual, x[:, 0], a learned token, a sum)
BACKWARD = ("residual-stack", "cls-position", "cls-token", "attention-sum", "gesture")


def test_forward_and_backward_on_micropython(tmp_path, micropython, seed=1, close=close):
    # every converted model inside MicroPython, portable loops and viper, against torch: the output,
    # and for the models in BACKWARD the input and parameter gradients of one backward
    jobs, wants = [], {}
    for case in sorted(CASES):
        _, _, tm, x = _case(tmp_path, case, seed)
        model, conv = torch_io._from_torch(tm)
        ck = tmp_path / (case + ".mfck")
        mf.checkpoint.save(str(ck), model, {"spec": mf.to_spec(model)})
        job = {"case": case, "ck": str(ck), "x": CASES[case][2](x).tolist()}
        wants[case] = (_want(case, tm, x), None)
        if case in BACKWARD:
            y, dy, dx, grads = _torch_grads(case, tm, x, conv)
            job["dy"] = dy.tolist()
            wants[case] = (y, (dx, grads))
        jobs.append(job)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    # viper: whole-model figures through several block-float kernels, relative to the largest value;
    # seeds 1..5 on both ports: outputs within 3e-4 (mean 2.5e-4 +- 3.6e-5 of the worst model per
    # seed), gradients within 2.1e-2 (mean 4.9e-3 +- 8.3e-3); portable: 4.6e-7 and 3e-6
    for backend, tol, gtol in (("python", 1e-5, 1e-5), ("viper", 5e-3, 5e-2)):
        out = tmp_path / ("out-%s.json" % backend)
        helpers.run_micropython(helpers.script("fx_models_mp.py"), str(tmp_path / "jobs.json"), str(out), backend,
                                exe=micropython, heap="16M")
        got = json.loads(out.read_text())
        assert sorted(got) == sorted(CASES)
        for case, r in got.items():
            what = "MicroPython %s %s" % (backend, case)
            y = np.asarray(r["y"]).reshape(r["shape"])
            want, back = wants[case]
            if back is None:
                close(_probs(y) if CASES[case][4] else y, want, what, tol)
                continue
            close(y, want, what, tol)
            dx, grads = back
            close(np.asarray(r["dx"]).reshape(dx.shape), dx, what + " dx", gtol)
            assert sorted(r["grads"]) == sorted(grads), what
            for name, g in grads.items():
                close(np.asarray(r["grads"][name]), g.reshape(-1), "%s d %s" % (what, name), gtol)


@pytest.mark.parametrize("case", ["gesture", "residual-stack", "cls-token", "attention-sum"])
def test_lora_adapters_on_a_converted_model_round_trip(tmp_path, case):
    # adapters on the module's own names (inside residuals too) save and load as one checkpoint
    _, _, tm, x = _case(tmp_path, case)
    model = torch_io.from_torch(tm)
    mf.seed(5)
    mf.add_lora(model, 2, 4, ("attention", "ffn", "dense") if case in ("gesture", "residual-stack")
                else ("attention", "dense"))
    for p, _ in model.params():                  # adapters off zero, so that they change the output
        if "lora_B" in p.name:
            p.data[:] = mf.Tensor.from_list([0.01 * (i % 7 - 3) for i in range(p.size)]).data
    names = [n for n, _ in model.named_params()]
    assert any(n.startswith(("enc.self_attn.q_proj.lora", "layers.0.self_attn.q_proj.lora",
                             "attn.q_proj.lora")) for n in names), names
    ck = tmp_path / "lora.mfck"
    mf.checkpoint.save(str(ck), model, {"spec": mf.to_spec(model)})
    back = mf.load_model(str(ck)).eval()
    assert [n for n, _ in back.named_params()] == names
    model.eval()
    xm = _mf_in(case, x)
    np.testing.assert_array_equal(np.asarray(back(xm).data), np.asarray(model(xm).data))


def test_apply_adapter_into_the_users_own_class(tmp_path):
    # an adapter file trained on a converted model (adapters inside a residual too) merges into the
    # user's own module, which then computes what the adapted model computes
    _, mod, tm, x = _case(tmp_path, "residual-stack")
    model = torch_io.from_torch(tm)
    base = tmp_path / "base.mfck"
    mf.checkpoint.save(str(base), model, {"spec": mf.to_spec(model)})
    mf.seed(3)
    mf.add_lora(model, 2, 4, ("attention", "dense"))
    assert any(n.startswith("ff.0.lora_") for n, _ in model.named_params())
    for p, _ in model.params():
        if "lora_B" in p.name:
            p.data[:] = mf.Tensor.from_list([0.02 * (i % 5 - 2) for i in range(p.size)]).data
    adapter = tmp_path / "tuned.mfad"
    mf.checkpoint.save_adapter(str(adapter), model, str(base))
    mine = getattr(mod, CASES["residual-stack"][0])()
    torch_io.load_into(mine, str(base))
    assert torch_io.apply_adapter(mine, str(adapter)) is mine
    close(mine.eval()(x), model.eval()(_mf_in("residual-stack", x)), "apply_adapter")
