"""The MicroPython side of tests/mp/test_viper_range.py: attention, cross-entropy, LayerNorm-free
layer kernels, GEMMs, pooling, Adam and activations, each case run through the portable kernels
(P) and the viper ones (V) on the same float32 inputs; results as hex float32 bits.

    MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/range_cases_mp.py CASES.json RESULTS.json [CHECKED_DIR]
"""
import microformer as mf
from array import array

from kernel_cases_mp import P, V, f32, hx, main, z  # noqa: F401

def run_att(c):
    B, Tq, Tk, C, NH, causal = c["B"], c["Tq"], c["Tk"], c["C"], c["NH"], c["causal"]
    q = f32(c["q"]); k = f32(c["k"]); v = f32(c["v"]); dout = f32(c["dout"])
    mask = None if c["mask"] is None else bytearray(c["mask"])
    r = {}
    att0 = None
    for tag, K in (("p", P), ("v", V)):
        o = z(B * Tq * C); a = z(B * NH * Tq * Tk)
        try:
            K.attention_forward(o, a, q, k, v, mask, B, Tq, Tk, C, NH, causal)
        except Exception as e:
            r[tag + "_error"] = repr(e)
            continue
        r[tag + "_out"] = hx(o); r[tag + "_att"] = hx(a)
        if att0 is None:
            att0 = a
    if att0 is not None:
        # the backward of both modules from the same (portable) weights
        for tag, K in (("p", P), ("v", V)):
            g = [z(B * Tq * C), z(B * Tk * C), z(B * Tk * C)]
            try:
                K.attention_backward(g[0], g[1], g[2], z(Tk), dout, att0, q, k, v, B, Tq, Tk, C, NH)
            except Exception as e:
                r[tag + "_error"] = repr(e)
                continue
            r[tag + "_dq"] = hx(g[0]); r[tag + "_dk"] = hx(g[1]); r[tag + "_dv"] = hx(g[2])
        r["att_used"] = hx(att0)
        if "keep" in c:                 # dropout on the weights: the same A, c's keep mask and scale
            keep = bytearray(c["keep"])
            for tag, K in (("p", P), ("v", V)):
                # the backward first, so no scratch the forward leaves behind can stand in for its own
                g = [z(B * Tq * C), z(B * Tk * C), z(B * Tk * C)]
                K.attention_backward_dropout(g[0], g[1], g[2], z(Tk), dout, att0, keep, q, k, v,
                                             B, Tq, Tk, C, NH, c["pscale"])
                o = z(B * Tq * C)
                K.attention_context(o, att0, keep, v, B, Tq, Tk, C, NH, c["pscale"])
                r[tag + "_dout_ctx"] = hx(o)
                r[tag + "_ddq"] = hx(g[0]); r[tag + "_ddk"] = hx(g[1]); r[tag + "_ddv"] = hx(g[2])
    return r

def run_xent(c):
    B, Vn = c["B"], c["V"]
    lg = f32(c["logits"])
    r = {}
    for tag, K in (("p", P), ("v", V)):
        d = z(B * Vn)
        try:
            l = K.crossentropy_softmax(d, lg, c["labels"], B, Vn)
        except Exception as e:
            r[tag + "_error"] = repr(e)
            continue
        r[tag + "_loss"] = repr(l); r[tag + "_d"] = hx(d)
    return r

def run_layer(c):
    # identity-weight single-head attention over the tokens: x [1, S, 1]
    r = {}
    for backend in ("python", "viper"):
        mf.set_backend(backend)
        a = mf.Attention(1, 1)
        for n in ("q", "k", "v", "o"):
            getattr(a, "W" + n).data[0] = 1.0
            getattr(a, "b" + n).data[0] = 0.0
        x = mf.Tensor.from_list([[[t] for t in c["tokens"]]])
        y = a.forward(x)
        r[backend + "_y"] = hx(y.data)
        r[backend + "_w"] = hx(array('f', [w for row in a.weights(0, 0) for w in row]))
    mf.set_backend("python")
    return r

def run_mm(c):
    N, C, OC = c["N"], c["C"], c["OC"]
    x = f32(c["x"]); w = f32(c["w"]); b = f32(c["b"]); dout = f32(c["dout"])
    r = {}
    for tag, K in (("p", P), ("v", V)):
        o = z(N * OC); di = z(N * C); dw = f32(c["dw0"]); db = f32(c["db0"])
        K.matmul_forward(o, x, w, b, N, C, OC)
        K.matmul_backward(di, dw, db, dout, x, w, N, C, OC)
        r[tag + "_out"] = hx(o); r[tag + "_dinp"] = hx(di); r[tag + "_dw"] = hx(dw); r[tag + "_db"] = hx(db)
    return r

def run_pool(c):
    B, T, C = c["B"], c["T"], c["C"]
    x = f32(c["x"]); dout = f32(c["dout"])
    r = {}
    for tag, K in (("p", P), ("v", V)):
        o = z(B * C); d = z(B * T * C)
        K.avgpool_forward(o, x, B, T, C)
        K.avgpool_backward(d, dout, B, T, C)
        r[tag + "_out"] = hx(o); r[tag + "_dinp"] = hx(d)
    return r

def run_act(c):
    r = {}
    x = f32(c["x"]); g = f32(c["g"]); n = len(x)
    for tag, K in (("p", P), ("v", V)):
        for kind in (P.RELU, P.LEAKY_RELU):
            o = z(n); d = z(n)
            K.act_forward(o, x, n, kind)
            K.act_backward(d, g, x, o, n, kind)
            r["%s_%d_out" % (tag, kind)] = hx(o); r["%s_%d_d" % (tag, kind)] = hx(d)
    return r

def run_adam(c):
    r = {}
    n = c["n"]
    for tag, K in (("p", P), ("v", V)):
        p = f32(c["p"]); m = f32(c["m"]); v = f32(c["v"]); g = f32(c["g"])
        for t in range(1, c["steps"] + 1):
            K.adam_update(p, g, m, v, n, c["lr"], 0.9, 0.999, 1e-8, c["wd"], 1 - 0.9 ** t, 1 - 0.999 ** t, c["dec"])
        r[tag + "_p"] = hx(p); r[tag + "_m"] = hx(m); r[tag + "_v"] = hx(v)
    return r


main({"att": run_att, "xent": run_xent, "layer": run_layer, "mm": run_mm, "pool": run_pool,
      "adam": run_adam, "act": run_act})
