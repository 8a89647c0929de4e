# Runs layer cases through lib/microformer and reports every output and gradient.
# The same file runs under CPython (imported by the tests) and under MicroPython:
#   MICROPYPATH=lib micropython tests/mf_driver.py cases.json results.json
import json
from array import array

import microformer as mf


def _tensor(spec):
    return mf.Tensor(tuple(spec["shape"]), array("f", spec["data"]))


def build_layer(spec):
    cls = getattr(mf, spec["type"])
    return cls(*spec.get("args", []), **spec.get("kwargs", {}))


def run_case(case):
    if "backend" in case:
        mf.set_backend(case["backend"])
    if "optim" in case:
        return run_optim(case)
    if "model" in case:
        return run_model(case)
    return run_layer(case)


def run_layer(case):
    """Forward and backward of one layer with given weights; every output and gradient."""
    layer = build_layer(case["layer"])
    named = {}
    for p, g in layer.params():
        named[p.name] = (p, g)
    for name in case.get("params", {}):
        vals = case["params"][name]
        p = named[name][0]
        for i in range(len(vals)):
            p.data[i] = vals[i]
    kwargs = {}
    for key, arg in (("mask", "key_padding_mask"), ("lengths", "lengths"), ("start", "start")):
        if key in case:
            kwargs[arg] = case[key]
    if "context" in case:
        kwargs["context"] = _tensor(case["context"])
    x = _tensor(case["x"])
    out = {}
    for rep in range(case.get("repeat", 1)):   # repeat > 1: parameter grads must accumulate
        y = layer.forward(x, **kwargs)
        dx = layer.backward(_tensor(case["dy"]))
    if isinstance(dx, tuple):
        dx, dctx = dx
        out["dcontext"] = list(dctx.data)
    out["y"] = list(y.data)
    if dx is not None:                         # Embedding has no input gradient
        out["dx"] = list(dx.data)
    for name in named:
        out["d" + name] = list(named[name][1].data)
    att = getattr(layer, "attn", layer)        # EncoderBlock: its attention's weights
    if getattr(att, "_A", None) is not None:
        out["A"] = list(att._A.data)
    if hasattr(att, "_dQ"):
        out["dQ"] = list(att._dQ.data)
    return out


def _optimizer(spec, pairs):
    cls = getattr(mf, spec["type"])
    return cls(pairs, **spec.get("kwargs", {}))


def run_optim(case):
    """Several steps of an optimizer on given (param, grad sequence); returns the params after each."""
    params = [_tensor(p) for p in case["params"]]
    grads = [mf.Tensor(p.shape) for p in params]
    opt = _optimizer(case["optim"], list(zip(params, grads)))
    out = {"p": []}
    for step_grads in case["grads"]:
        for g, values in zip(grads, step_grads):
            for i in range(len(values)):
                g.data[i] = values[i]
        if "clip" in case:
            out.setdefault("norm", []).append(mf.clip_grad_norm(opt.params, case["clip"]))
        opt.step()
        out["p"].append([list(p.data) for p in params])
    return out


def run_model(case):
    """Sequential end to end: loss and every grad, then one optimizer step."""
    model = mf.Sequential([build_layer(s) for s in case["model"]])
    named = dict(model.named_params())
    for name in case["params"]:
        vals = case["params"][name]
        for i in range(len(vals)):
            named[name].data[i] = vals[i]
    grads = {}
    for i, layer in enumerate(model.layers):
        for p, g in layer.params():
            grads["%d.%s" % (i, p.name)] = g
    opt = _optimizer(case["opt"], model)
    loss_fn = mf.CrossEntropyLoss()
    opt.zero_grad()
    logits = model.forward(_tensor(case["x"]))
    out = {"logits": list(logits.data), "loss": loss_fn.forward(logits, case["labels"])}
    out["dx"] = list(model.backward(loss_fn.backward()).data)
    for name in grads:
        out["d" + name] = list(grads[name].data)
    opt.step()
    for name in named:
        out["new " + name] = list(named[name].data)
    return out


def main(argv, run=None):
    # argv[3]: the backend every case runs on unless it names one ('python' by default)
    mf.set_backend(argv[3] if len(argv) > 3 else "python")
    with open(argv[1]) as f:
        cases = json.load(f)
    results = [(run or run_case)(c) for c in cases]
    with open(argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    import sys
    main(sys.argv)
