"""The MicroPython side of tests/mp/test_viper_decode_range.py: the decoding and sequence kernels
(residual add, positions, embedding, LayerNorm, GELU, KV cache, decoding attention, kept GEMMs,
argmax), each case through the portable kernels (P) and the viper ones (V); hex float32 bits.

    MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/decode_cases_mp.py CASES.json RESULTS.json [CHECKED_DIR]
"""
from kernel_cases_mp import P, V, f32, hx, main, z  # noqa: F401

def run(c):
    k = c["kind"]
    r = {}
    if k == "add":
        a = f32(c["a"]); b = f32(c["b"]); n = len(a)
        o = z(n); V.add_forward(o, a, b, n); r["add"] = hx(o)
        B, S, C = c["B"], c["S"], c["C"]
        o = z(B * S * C); V.posenc_forward(o, a, b, B, S, C, c["start"]); r["pos"] = hx(o)
        t = f32(c["a"]); V.embedding_backward(t, b, f32(c["ids"]), c["N"], c["EC"]); r["emb"] = hx(t)
        d = z(B * S * C)                       # dout: values of a past its specials
        for i in range(B * S * C):
            d[i] = a[400 + i]
        t = f32(c["b"]); V.posembed_backward(t, d, B, S, C, c["start"]); r["posb"] = hx(t)
    elif k == "drop":
        x = f32(c["x"]); n = len(x); keep = bytearray(c["keep"])
        r["v"] = []
        for sc in f32(c["scales"]):             # float32 bits: no decimal parsing on the way
            o = f32(c["x"])                     # every output written: no stale value may pass
            V.dropout_apply(o, x, keep, n, sc)
            r["v"].append(hx(o))
        r["s"] = []                             # scale_inplace: the same product, unmasked, in place
        for sc in f32(c["scales"]):
            o = f32(c["x"])
            V.scale_inplace(o, n, sc)
            r["s"].append(hx(o))
    elif k == "embed":
        ids = f32(c["ids"]); t = f32(c["table"]); N = len(ids); C = c["C"]; Vn = c["V"]
        for tag, K in (("p", P), ("v", V)):
            o = z(N * C)
            r[tag + "_bad"] = K.embedding_forward(o, ids, t, N, C, Vn)
            r[tag + "_out"] = hx(o)
        src = f32(c["src"]); B, S, L, C = c["B"], c["S"], c["L"], c["KC"]
        for tag, K in (("p", P), ("v", V)):
            cache = f32(c["cache"])
            K.kv_store(cache, src, B, S, L, C, c["pos"])
            r[tag + "_kv"] = hx(cache)
    elif k == "dec":
        B, T, L, C, NH = c["B"], c["T"], c["L"], c["C"], c["NH"]
        o = z(B * C); a = f32(c["att0"])
        V.attention_decode(o, a, f32(c["q"]), f32(c["kc"]), f32(c["vc"]), B, T, L, C, NH)
        r["out"] = hx(o); r["att"] = hx(a)
        # the same query through attention_forward on the packed first T keys (B, T, C)
        kc = f32(c["kc"]); vc = f32(c["vc"]); kp = z(B * T * C); vp = z(B * T * C)
        for b in range(B):
            for i in range(T * C):
                kp[b * T * C + i] = kc[b * L * C + i]
                vp[b * T * C + i] = vc[b * L * C + i]
        o2 = z(B * C); a2 = z(B * NH * T)
        V.attention_forward(o2, a2, f32(c["q"]), kp, vp, None, B, 1, T, C, NH, 0)
        r["fout"] = hx(o2); r["fatt"] = hx(a2)
    elif k == "ln":
        N, C = c["N"], c["C"]
        o = z(N * C); m = z(N); s = z(N)
        V.layernorm_forward(o, f32(c["x"]), [f32(c["w"]), f32(c["b"]), m, s], N, C, c["eps"])
        r["y"] = hx(o); r["mean"] = hx(m); r["rstd"] = hx(s)
    elif k == "lnb":
        N, C = c["N"], c["C"]
        dx = z(N * C); dw = f32(c["dw0"]); db = f32(c["db0"])
        V.layernorm_backward(dx, f32(c["g"]), f32(c["x"]), [f32(c["w"]), None, f32(c["mean"]), f32(c["rstd"]),
                                                        dw, db], N, C)
        r["dx"] = hx(dx); r["dw"] = hx(dw); r["db"] = hx(db)
        dx2 = z(N * C)
        V.layernorm_backward(dx2, f32(c["g"]), f32(c["x"]), [f32(c["w"]), None, f32(c["mean"]), f32(c["rstd"]),
                                                         None, None], N, C)
        r["dx2"] = hx(dx2)
    elif k == "sgd":
        n = c["n"]
        pv = f32(c["p"]); bv = f32(c["b"]) if c["mom"] else None
        V.sgd_update(pv, f32(c["g"]), bv, n, c["lr"], c["mom"], c["wd"])
        r["p"] = hx(pv)
        if bv is not None:
            r["b"] = hx(bv)
    elif k == "gelu":
        x = f32(c["x"]); g = f32(c["g"]); n = len(x)
        y = z(n); d = z(n)
        V.act_forward(y, x, n, c["code"]); V.act_backward(d, g, x, y, n, c["code"])
        r["y"] = hx(y); r["d"] = hx(d)
    elif k == "kept":
        N, C, OC = c["N"], c["C"], c["OC"]
        x = f32(c["x"]); w = f32(c["w"]); b = f32(c["b"]) if c["b"] is not None else None
        keep = [None]
        if c.get("made"):                   # kept rows made beforehand (as mf.prefill does)
            V.keep_weight(keep, w, b, C, OC)
        outs = []
        for j in range(len(c["edits"]) + 1):
            if j:
                i, val = c["edits"][j - 1]
                w[i] = val                  # a changed weight (one element, one bit, back again)
            o = z(N * OC); o2 = z(N * OC)
            V.matmul_forward_kept(o, x, w, b, N, C, OC, keep)
            V.matmul_forward(o2, x, w, b, N, C, OC)
            outs.append([hx(o), hx(o2)])
        r["outs"] = outs
    elif k == "argmax":
        x = f32(c["x"])
        r["p"] = [P.argmax(x, o, n) for o, n in c["rows"]]
        r["v"] = [V.argmax(x, o, n) for o, n in c["rows"]]
    return r


main(run)
