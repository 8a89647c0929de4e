# Runs cases through lib/microformer and reports every output and gradient: layers (the core ones
# and the attention family), Sequential models, optimizers, KV-cache decoding, mf.show, bad input.
# The same file runs under CPython (imported by the tests) and under MicroPython:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/driver_mp.py cases.json results.json [backend]
import json
from array import array

import microformer as mf
from microformer.tensor import Rng


def _tensor(spec):
    return mf.Tensor(tuple(spec["shape"]), array("f", spec["data"]))


def build_layer(spec):
    cls = getattr(mf, spec["type"])
    return cls(*spec.get("args", []), **spec.get("kwargs", {}))


def run_case(case):
    if "backend" in case:
        mf.set_backend(case["backend"])
    kind = case.get("kind", "layer")
    if kind == "decode":
        return run_decode(case)
    if kind == "show":
        mf.seed(1)
        a = mf.Attention(8, 2, causal=True)
        a.forward(mf.Tensor((1, 4, 8)).fill(0.3), lengths=[3])
        lines = []
        rows = mf.show(a, 0, 1, out=lines.append)
        return {"rows": rows, "lines": lines}
    if kind == "bad":
        import family_bad_mp
        return family_bad_mp.run_all()
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
    for _ in range(case.get("repeat", 1)):   # repeat > 1: parameter grads must accumulate
        y = layer.forward(x, **kwargs)
        dx = layer.backward(_tensor(case["dy"]))
    if getattr(layer, "dcontext", None) is not None:
        out["dcontext"] = list(layer.dcontext.data)
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
        if len(step_grads) != len(grads):
            raise ValueError("optim case: %d grads for %d params" % (len(step_grads), len(grads)))
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


def _rand(shape, rng, lo=-1.0, hi=1.0):
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(lo, hi)
    return t


def _slice_seq(x, s0, s1):
    B, S, E = x.shape
    out = mf.Tensor((B, s1 - s0, E))
    for b in range(B):
        for s in range(s0, s1):
            for e in range(E):
                out.data[(b * (s1 - s0) + s - s0) * E + e] = x.data[(b * S + s) * E + e]
    return out


def run_decode(case):
    """Full causal forward vs prefill(first P tokens) + decode_step for the rest."""
    if "backend" in case:
        mf.set_backend(case["backend"])
    mf.seed(case.get("seed", 1))
    rng = Rng(case.get("seed", 1) + 100)
    B, S, P = case["B"], case["S"], case["P"]
    E, H, V = case["E"], case["H"], case.get("vocab")
    L = case.get("max_len", S)
    if V:   # a token model: Embedding -> PositionalEncoding -> blocks -> LayerNorm -> Dense
        layers = [mf.Embedding(V, E), mf.PositionalEncoding(L, E)]
        for _ in range(case.get("blocks", 1)):
            layers.append(mf.EncoderBlock(E, H, 2 * E, causal=True, max_len=L))
        layers += [mf.LayerNorm(E), mf.Dense(E, V)]
        model = mf.Sequential(layers)
        ids = [[rng.randint(V) for _ in range(S)] for _ in range(B)]
        full = list(model.forward(mf.Tensor.from_list(ids)).data)
        outs = list(mf.prefill(model, mf.Tensor.from_list([r[:P] for r in ids])).data)
        steps = [list(mf.decode_step(model, mf.Tensor.from_list([[r[s]] for r in ids])).data)
                 for s in range(P, S)]   # outputs are reused buffers: copy each
        width = V
    else:
        kind = case.get("layer", "Attention")
        model = mf.Attention(E, H, causal=True, max_len=L) if kind == "Attention" else \
            mf.EncoderBlock(E, H, 2 * E, causal=True, max_len=L)
        x = _rand((B, S, E), rng)
        full = list(model.forward(x).data)
        outs = list(model.prefill(_slice_seq(x, 0, P)).data)
        steps = [list(model.decode_step(_slice_seq(x, s, s + 1)).data) for s in range(P, S)]
        width = E
    # reassemble [B,S,width] from the prefill output [B,P,w] and the steps [B,1,w]
    got = [0.0] * (B * S * width)
    for b in range(B):
        for s in range(P):
            for e in range(width):
                got[(b * S + s) * width + e] = outs[(b * P + s) * width + e]
        for k, t in enumerate(steps):
            for e in range(width):
                got[(b * S + P + k) * width + e] = t[b * width + e]
    err = 0.0
    scale = 1e-30
    for i in range(len(full)):
        d = abs(got[i] - full[i])
        if d > err:
            err = d
        if abs(full[i]) > scale:
            scale = abs(full[i])
    # the cache the prefill allocated, per token of capacity and sequence (B sequences, L tokens)
    layers = model.layers if hasattr(model, "layers") else [model]
    cache = 0
    for l in layers:
        a = getattr(l, "attn", l)
        if hasattr(a, "kv_cache_bytes"):
            cache += a.kv_cache_bytes()
    return {"full": full, "decoded": got, "rel_err": err / scale,
            "kv_bytes_per_token": mf.kv_bytes_per_token(model), "kv_cache_per_token": cache / (B * L)}


def main(argv, run=None):
    # argv: [script, CASES.json, RESULTS.json, backend]; backend: the one every case runs on unless
    # it names one ('python' by default); run: the function of a case (run_case)
    mf.set_backend(argv[3] if len(argv) > 3 else "python")
    with open(argv[1]) as f:
        cases = json.load(f)
    results = [(run or run_case)(c) for c in cases]
    with open(argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    import sys
    main(sys.argv)
