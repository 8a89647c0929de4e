"""Attention-family cases (inputs, weights, upstream grads) and expected results from tests/oracles/reference.py."""
import numpy as np

import reference as ref
from helpers import f32
from layer_cases import ATTN_NAMES, _spec


def _flat(p):
    return {k: [float(v) for v in a.ravel()] for k, a in p.items()}


def layernorm_case(rng, shape):
    E = shape[-1]
    x = f32(rng.normal(scale=2.0, size=shape) + 1.0)
    p = {"gamma": f32(rng.normal(1.0, 0.3, size=E)), "beta": f32(rng.normal(scale=0.3, size=E))}
    dy = f32(rng.normal(size=shape))
    y, c = ref.layernorm_forward(x, p["gamma"], p["beta"])
    dx, dg, db = ref.layernorm_backward(dy, c)
    case = {"layer": {"type": "LayerNorm", "args": [E]}, "params": _flat(p), "x": _spec(x), "dy": _spec(dy)}
    return "LayerNorm %s" % list(shape), case, {"y": y, "dx": dx, "dgamma": dg, "dbeta": db}


def feedforward_case(rng, shape, hidden, kind):
    E = shape[-1]
    x = f32(rng.normal(size=shape))
    p = {"W1": f32(rng.normal(scale=0.5, size=(hidden, E))), "b1": f32(rng.normal(scale=0.2, size=hidden)),
         "W2": f32(rng.normal(scale=0.5, size=(E, hidden))), "b2": f32(rng.normal(scale=0.2, size=E))}
    dy = f32(rng.normal(size=shape))
    y, c = ref.feedforward_forward(x, p, kind)
    dx, g = ref.feedforward_backward(dy, c, p)
    want = dict(g, y=y, dx=dx)
    case = {"layer": {"type": "FeedForward", "args": [E, hidden], "kwargs": {"activation": kind}},
            "params": _flat(p), "x": _spec(x), "dy": _spec(dy)}
    return "FeedForward %s h%d %s" % (list(shape), hidden, kind), case, want


def embedding_case(rng, B, S, V, E):
    ids = rng.integers(0, V, size=(B, S))
    ids[0, :min(2, S)] = V - 1           # a repeated id: its rows must add up
    W = f32(rng.normal(size=(V, E)))
    dy = f32(rng.normal(size=(B, S, E)))
    want = {"y": ref.embedding_forward(ids, W), "dW": ref.embedding_backward(dy, ids, V)}
    case = {"layer": {"type": "Embedding", "args": [V, E]}, "params": {"W": [float(v) for v in W.ravel()]},
            "x": _spec(ids.astype(np.float64)), "dy": _spec(dy)}
    return "Embedding B%d S%d V%d E%d" % (B, S, V, E), case, want


def posenc_case(rng, B, S, E, max_len, start=0):
    x = f32(rng.normal(size=(B, S, E)))
    dy = f32(rng.normal(size=(B, S, E)))
    pe = ref.positional_encoding(max_len, E)
    case = {"layer": {"type": "PositionalEncoding", "args": [max_len, E]}, "x": _spec(x), "dy": _spec(dy),
            "start": start}
    return ("PositionalEncoding B%d S%d E%d L%d start%d" % (B, S, E, max_len, start), case,
            {"y": x + pe[start:start + S][None], "dx": dy})


def _lengths_mask(lengths, Sk):
    return [[1 if j >= n else 0 for j in range(Sk)] for n in lengths]


def block_case(rng, B, S, E, H, hidden, causal=False, mask=None, lengths=None, kind="gelu"):
    x = f32(rng.normal(size=(B, S, E)))
    p = {"ln1.gamma": f32(rng.normal(1.0, 0.2, size=E)), "ln1.beta": f32(rng.normal(scale=0.2, size=E)),
         "ln2.gamma": f32(rng.normal(1.0, 0.2, size=E)), "ln2.beta": f32(rng.normal(scale=0.2, size=E)),
         "ffn.W1": f32(rng.normal(scale=0.5, size=(hidden, E))), "ffn.b1": f32(rng.normal(scale=0.2, size=hidden)),
         "ffn.W2": f32(rng.normal(scale=0.5, size=(E, hidden))), "ffn.b2": f32(rng.normal(scale=0.2, size=E))}
    for n in ATTN_NAMES:
        p["attn." + n] = f32(rng.normal(scale=0.5, size=(E, E) if n[0] == "W" else E))
    dy = f32(rng.normal(size=(B, S, E)))
    m = mask if mask is not None else (_lengths_mask(lengths, S) if lengths is not None else None)
    y, c = ref.encoder_block_forward(x, p, H, causal=causal, key_padding_mask=m, kind=kind)
    dx, g = ref.encoder_block_backward(dy, c, p)
    want = dict(g, y=y, dx=dx)
    case = {"layer": {"type": "EncoderBlock", "args": [E, H, hidden], "kwargs": {"causal": causal, "activation": kind}},
            "params": _flat(p), "x": _spec(x), "dy": _spec(dy)}
    if mask is not None:
        case["mask"] = mask
    if lengths is not None:
        case["lengths"] = lengths
    name = "EncoderBlock B%d S%d E%d H%d h%d %s%s%s%s" % (B, S, E, H, hidden, kind, " causal" if causal else "",
                                                        " mask" if mask else "", " lengths" if lengths else "")
    return name, case, want


def attention_case(rng, B, S, E, H, causal=False, lengths=None, mask=None, Sk=None):
    """Attention with lengths (tail padding) and/or cross-attention with a key mask."""
    x = f32(rng.normal(size=(B, S, E)))
    p = {n: f32(rng.normal(scale=0.5 if n[0] == "W" else 0.2, size=(E, E) if n[0] == "W" else E))
         for n in ATTN_NAMES}
    context = f32(rng.normal(size=(B, Sk, E))) if Sk is not None else None
    dy = f32(rng.normal(size=(B, S, E)))
    m = mask if mask is not None else (_lengths_mask(lengths, Sk or S) if lengths is not None else None)
    y, c = ref.attention_forward(x, p, H, causal=causal, key_padding_mask=m, context=context)
    dx, g, dctx = ref.attention_backward(dy, c, p)
    want = {"y": y, "dx": dx, "A": c["A"]}
    for n in p:
        want["d" + n] = g["d" + n]
    case = {"layer": {"type": "Attention", "args": [E, H], "kwargs": {"causal": causal}},
            "params": _flat(p), "x": _spec(x), "dy": _spec(dy)}
    if lengths is not None:
        case["lengths"] = lengths
    if mask is not None:
        case["mask"] = mask
    if context is not None:
        case["context"] = _spec(context)
        want["dcontext"] = dctx
    name = "Attention B%d S%d E%d H%d%s%s%s%s" % (B, S, E, H, " causal" if causal else "",
                                                " lengths%s" % lengths if lengths else "", " mask" if mask else "",
                                                " cross Sk%d" % Sk if Sk else "")
    return name, case, want


def all_cases(seed=4321):
    rng = np.random.default_rng(seed)
    return [
        layernorm_case(rng, (2, 3, 8)),
        layernorm_case(rng, (5, 4)),
        layernorm_case(rng, (1, 1, 6)),
        feedforward_case(rng, (2, 3, 8), 16, "gelu"),
        feedforward_case(rng, (4, 6), 5, "relu"),
        embedding_case(rng, 2, 5, 7, 4),
        embedding_case(rng, 1, 1, 3, 6),
        posenc_case(rng, 2, 5, 6, 8),
        posenc_case(rng, 1, 3, 5, 10, start=4),      # odd E, an offset (decoding)
        attention_case(rng, 2, 4, 8, 2, lengths=[3, 4]),
        attention_case(rng, 3, 5, 8, 2, lengths=[0, 2, 5]),            # a zero length: all keys padded
        attention_case(rng, 2, 5, 8, 2, causal=True, lengths=[3, 5]),  # causal + padding
        attention_case(rng, 2, 3, 8, 2, Sk=5, lengths=[2, 5]),         # cross-attention with padded context
        attention_case(rng, 2, 3, 4, 1, Sk=4, mask=[[0, 1, 1, 0], [1, 1, 1, 1]]),  # cross, all-masked item
        block_case(rng, 2, 4, 8, 2, 16),
        block_case(rng, 2, 5, 8, 2, 12, causal=True),
        block_case(rng, 2, 4, 8, 4, 8, mask=[[0, 0, 1, 0], [0, 0, 0, 0]], kind="relu"),
        block_case(rng, 3, 4, 6, 3, 10, lengths=[4, 1, 0]),
        feedforward_case(rng, (3, 5), 7, "gelu_tanh"),
        block_case(rng, 2, 3, 8, 2, 12, kind="gelu_tanh"),
    ]


DECODE = [
    ("Attention prefill 3 + decode 4", {"kind": "decode", "B": 2, "S": 7, "P": 3, "E": 8, "H": 2, "max_len": 9}),
    ("Attention prefill 1 + decode 5", {"kind": "decode", "B": 1, "S": 6, "P": 1, "E": 4, "H": 1}),
    ("EncoderBlock prefill 2 + decode 4", {"kind": "decode", "layer": "EncoderBlock", "B": 2, "S": 6, "P": 2,
                                            "E": 8, "H": 2, "max_len": 8}),
    ("token model 2 blocks", {"kind": "decode", "vocab": 11, "blocks": 2, "B": 2, "S": 7, "P": 3, "E": 8, "H": 2,
                              "max_len": 10}),
]
