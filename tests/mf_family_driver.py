# Runs attention-family cases through lib/microformer: layers (LayerNorm, FeedForward, Embedding,
# PositionalEncoding, EncoderBlock, Attention with lengths), KV-cache decoding, bad input.
# The same file runs under CPython (imported by the tests) and under MicroPython:
#   MICROPYPATH=lib:tests micropython tests/mf_family_driver.py cases.json results.json
import json
from array import array

import microformer as mf
from microformer.tensor import Rng
from mf_driver import _tensor, build_layer, run_layer  # noqa: F401  (shared with the core cases)


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
    return {"full": full, "decoded": got, "rel_err": err / scale,
            "kv_bytes_per_token": mf.kv_bytes_per_token(model)}


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
        import family_bad
        return family_bad.run_all()
    return run_layer(case)


if __name__ == "__main__":
    import sys
    import mf_driver
    mf_driver.main(sys.argv, run_case)
