"""Layer cases (inputs, weights, upstream grads) and their expected results from tests/oracles/reference.py."""
import numpy as np

import reference as ref
from helpers import f32

ATTN_NAMES = ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo")


def _spec(a):
    return {"shape": list(a.shape), "data": [float(v) for v in a.ravel()]}


def dense_case(rng, in_shape, out_features, use_bias=True):
    C = in_shape[-1]
    x = f32(rng.normal(size=in_shape))
    W = f32(rng.normal(scale=0.5, size=(out_features, C)))
    b = f32(rng.normal(size=out_features)) if use_bias else None
    dy = f32(rng.normal(size=tuple(in_shape[:-1]) + (out_features,)))
    params = {"W": W} if b is None else {"W": W, "b": b}
    dx, dW, db = ref.dense_backward(dy, x, W)
    want = {"y": ref.dense_forward(x, W, b), "dx": dx, "dW": dW}
    if b is not None:
        want["db"] = db
    case = {"layer": {"type": "Dense", "args": [C, out_features], "kwargs": {"use_bias": use_bias}},
            "params": {k: [float(v) for v in p.ravel()] for k, p in params.items()},
            "x": _spec(x), "dy": _spec(dy)}
    return "Dense%s->%d%s" % (list(in_shape), out_features, "" if use_bias else " nobias"), case, want


def attention_case(rng, B, S, E, H, use_bias=True, causal=False, mask=None, Sk=None, scale=0.5):
    x = f32(rng.normal(size=(B, S, E)))
    p = {}
    for n in ATTN_NAMES:
        if n.startswith("W"):
            p[n] = f32(rng.normal(scale=scale, size=(E, E)))
        elif use_bias:
            p[n] = f32(rng.normal(scale=0.2, size=E))
    context = f32(rng.normal(size=(B, Sk, E))) if Sk is not None else None
    dy = f32(rng.normal(size=(B, S, E)))
    y, cache = ref.attention_forward(x, p, H, causal=causal, key_padding_mask=mask, context=context)
    dx, g, dctx = ref.attention_backward(dy, cache, p)
    want = {"y": y, "dx": dx}
    for n in p:
        want["d" + n] = g["d" + n]
    case = {"layer": {"type": "Attention", "args": [E, H], "kwargs": {"use_bias": use_bias, "causal": causal}},
            "params": {k: [float(v) for v in a.ravel()] for k, a in p.items()},
            "x": _spec(x), "dy": _spec(dy)}
    if mask is not None:
        case["mask"] = [[int(v) for v in row] for row in mask]
    if context is not None:
        case["context"] = _spec(context)
        want["dcontext"] = dctx
    name = "Attention B%d S%d E%d H%d%s%s%s%s" % (B, S, E, H, "" if use_bias else " nobias",
                                                 " causal" if causal else "", " mask" if mask is not None else "",
                                                 " cross Sk%d" % Sk if Sk is not None else "")
    return name, case, want


def activation_case(rng, kind, shape):
    x = f32(rng.normal(scale=2.0, size=shape))
    x.ravel()[:3] = [0.0, -1e-3, 1e-3]
    dy = f32(rng.normal(size=shape))
    want = {"y": ref.act_forward(kind, x), "dx": ref.act_backward(kind, dy, x)}
    case = {"layer": {"type": "ActivationLayer", "args": [kind]}, "x": _spec(x), "dy": _spec(dy)}
    return "Activation %s %s" % (kind, list(shape)), case, want


def pool_case(rng, B, S, E):
    x = f32(rng.normal(size=(B, S, E)))
    dy = f32(rng.normal(size=(B, E)))
    want = {"y": ref.avgpool_forward(x), "dx": ref.avgpool_backward(dy, S)}
    case = {"layer": {"type": "GlobalAvgPool"}, "x": _spec(x), "dy": _spec(dy)}
    return "GlobalAvgPool B%d S%d E%d" % (B, S, E), case, want


def all_cases(seed=1234):
    rng = np.random.default_rng(seed)
    cases = [
        dense_case(rng, (1, 4), 3),
        dense_case(rng, (5, 7), 2),
        dense_case(rng, (3, 2), 9),
        dense_case(rng, (2, 3, 5), 4),
        dense_case(rng, (4, 6), 6, use_bias=False),
        attention_case(rng, 1, 1, 4, 1),
        attention_case(rng, 2, 4, 8, 2),
        attention_case(rng, 3, 5, 6, 3),
        attention_case(rng, 2, 3, 4, 4),          # H = E: head_dim 1
        attention_case(rng, 1, 6, 8, 1),
        attention_case(rng, 2, 4, 8, 2, use_bias=False),
        attention_case(rng, 16, 4, 8, 2),         # the Iris block
        attention_case(rng, 2, 5, 8, 2, causal=True),
        attention_case(rng, 2, 4, 8, 2, mask=[[0, 1, 0, 0], [1, 1, 1, 1]]),   # pad mid-row; all-pad row
        attention_case(rng, 2, 3, 8, 2, Sk=5),    # cross-attention
        pool_case(rng, 2, 3, 4),
        pool_case(rng, 1, 1, 5),
        pool_case(rng, 3, 7, 2),
    ]
    for kind in ("relu", "leaky_relu", "gelu", "gelu_tanh", "tanh", "sigmoid"):
        cases.append(activation_case(rng, kind, (3, 7)))
    return cases
