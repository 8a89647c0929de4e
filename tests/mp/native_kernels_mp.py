# Every kernel of the native backend (mf_native.mpy) against the portable kernel of the same name on
# the same seeded inputs; prints one line per output: "ERR kernel/output relative-error", where the
# error is max |native - portable| / max |portable| (exact outputs: 0), then "DONE n".
#   MICROPYPATH=lib:build/native/x64 .venv/bin/micropython -X heapsize=8M tests/mp/native_kernels_mp.py
# (build/native/x86 with build/mp32/micropython32-sp). tests/mp/test_native.py runs it on both ports.
from array import array

import microformer as mf
from microformer import kernels as P
from microformer import kernels_native as N
from microformer import tensor
from microformer.actkind import GELU, GELU_TANH, LEAKY_RELU, RELU, SIGMOID, TANH

rng = tensor.Rng(7)
count = 0


def rand(n, scale=1.0):
    return array("f", [scale * (2.0 * rng.uniform() - 1.0) for _ in range(n)])


def zeros(n):
    return array("f", bytes(4 * n))


def err(a, b):
    big = 0.0
    worst = 0.0
    for i in range(len(b)):
        big = max(big, abs(b[i]))
        worst = max(worst, abs(a[i] - b[i]))
    return worst / big if big > 0 else worst


def report(name, a, b):
    global count
    count += 1
    print("ERR %s %.3e" % (name, err(a, b)))


def both(name, outs, call):
    # call(K, outputs) on the portable and the native kernels, each on its own copy of outs
    mine = [None if o is None else array("f", o) for o in outs]
    theirs = [None if o is None else array("f", o) for o in outs]
    r1 = call(P, theirs)
    r2 = call(N, mine)
    for i in range(len(outs)):
        if outs[i] is not None:
            report("%s/%d" % (name, i), mine[i], theirs[i])
    if r1 is not None:
        report(name + "/return", array("f", [r2]), array("f", [r1]))


# guards, copies, adds
buf = rand(37)
both("zero", [buf], lambda K, o: K.zero(o[0], 37))
both("copy", [zeros(37)], lambda K, o: K.copy(o[0], buf, 37))
bad = rand(20)
bad[13] = float("inf")
print("ERR first_nonfinite/return %d" % (abs(N.first_nonfinite(bad, 20) - P.first_nonfinite(bad, 20))
                                          + abs(N.first_nonfinite(buf, 37) - P.first_nonfinite(buf, 37))))
count += 1
# the optimizer's exponent bound: huge, tiny, subnormal, zero, NaN and inf values, and pairs of Tensors
ex = rand(40, 1e30)
ex[3], ex[4], ex[5], ex[6] = 1e-40, 0.0, -3.4e38, 1.5e-45
nan = rand(9)
nan[7] = float("nan")
d = 0
for v in (ex, buf, nan, bad, zeros(5), rand(11, 1e-30)):
    d += abs(N.max_exponent(v, len(v)) - P.max_exponent(v, len(v)))
d += abs(N.max_exponent(ex, 3) - P.max_exponent(ex, 3))
ts = [(tensor.Tensor((6,), rand(6, 1e5)), tensor.Tensor((6,), rand(6, 1e-3))),
      (tensor.Tensor((3, 3), rand(9)), tensor.Tensor((3, 3), rand(9, 1e20)))]
for j in (0, 1):
    d += abs(N.max_exponent_pairs(ts, j) - P.max_exponent_pairs(ts, j))
d += abs(N.max_exponent_pairs([], 0) - P.max_exponent_pairs([], 0))
print("ERR max_exponent/return %d" % d)
count += 1
print("ERR max_exponent_pairs/return %d" % d)
count += 1
a, b = rand(29), rand(29)
both("add_forward", [zeros(29)], lambda K, o: K.add_forward(o[0], a, b, 29))

# the GEMM: odd sizes (tails of the four-lane sums) and a long reduction
for (Nn, C, OC) in ((5, 7, 3), (16, 4, 32), (8, 64, 64), (3, 129, 5)):
    inp, w, bias, dout = rand(Nn * C), rand(OC * C), rand(OC), rand(Nn * OC)
    tag = "%dx%dx%d" % (Nn, C, OC)
    both("matmul_forward " + tag, [zeros(Nn * OC)], lambda K, o: K.matmul_forward(o[0], inp, w, bias, Nn, C, OC))
    both("matmul_forward nobias " + tag, [zeros(Nn * OC)], lambda K, o: K.matmul_forward(o[0], inp, w, None, Nn, C, OC))
    both("matmul_forward_kept " + tag, [zeros(Nn * OC)],
         lambda K, o: K.matmul_forward_kept(o[0], inp, w, bias, Nn, C, OC, [None]))
    both("matmul_backward " + tag, [zeros(Nn * C), rand(OC * C), rand(OC)],
         lambda K, o: K.matmul_backward(o[0], o[1], o[2], dout, inp, w, Nn, C, OC))
    both("matmul_backward_input " + tag, [rand(Nn * C)], lambda K, o: K.matmul_backward_input(o[0], dout, w, Nn, C, OC))
    both("matmul_backward_input_acc " + tag, [rand(Nn * C)],
         lambda K, o: K.matmul_backward_input_acc(o[0], dout, w, Nn, C, OC))
    both("matmul_backward_weight " + tag, [rand(OC * C), rand(OC)],
         lambda K, o: K.matmul_backward_weight(o[0], o[1], dout, inp, Nn, C, OC))
    both("matmul_backward_weight nobias " + tag, [rand(OC * C)],
         lambda K, o: K.matmul_backward_weight(o[0], None, dout, inp, Nn, C, OC))

# attention: padding mask, causal with Tk > Tq, a query row that sees no key
for (B, Tq, Tk, C, NH, causal, masked) in ((2, 4, 4, 8, 2, 0, 0), (2, 3, 5, 12, 3, 1, 1), (1, 6, 6, 16, 1, 1, 0)):
    q, k, v, dout = rand(B * Tq * C, 2.0), rand(B * Tk * C, 2.0), rand(B * Tk * C), rand(B * Tq * C)
    mask = None
    if masked:
        mask = bytearray(B * Tk)
        mask[1] = mask[Tk - 1] = 1
        for j in range(Tk):                     # batch item 1: every key hidden
            mask[Tk + j] = 1
    tag = "B%d Tq%d Tk%d C%d H%d causal%d mask%d" % (B, Tq, Tk, C, NH, causal, masked)
    att_n, att_p = zeros(B * NH * Tq * Tk), zeros(B * NH * Tq * Tk)
    out_n, out_p = zeros(B * Tq * C), zeros(B * Tq * C)
    P.attention_forward(out_p, att_p, q, k, v, mask, B, Tq, Tk, C, NH, causal)
    N.attention_forward(out_n, att_n, q, k, v, mask, B, Tq, Tk, C, NH, causal)
    report("attention_forward out " + tag, out_n, out_p)
    report("attention_forward att " + tag, att_n, att_p)
    hidden = 0
    for i in range(len(att_p)):
        if att_p[i] == 0.0 and att_n[i] != 0.0:
            hidden += 1
    print("ERR attention_forward hidden-keys-weigh-0 %s %d" % (tag, hidden))
    count += 1
    both("attention_backward " + tag, [rand(B * Tq * C), rand(B * Tk * C), rand(B * Tk * C), zeros(Tk)],
         lambda K, o: K.attention_backward(o[0], o[1], o[2], o[3], dout, att_p, q, k, v, B, Tq, Tk, C, NH))
# one-token decoding against a KV cache of L rows, T of them valid
for (B, T, L, C, NH) in ((2, 5, 8, 8, 2), (1, 1, 4, 12, 3)):
    q, kc, vc = rand(B * C, 2.0), rand(B * L * C, 2.0), rand(B * L * C)
    both("attention_decode B%d T%d L%d C%d H%d" % (B, T, L, C, NH), [zeros(B * C), zeros(B * NH * L)],
         lambda K, o: K.attention_decode(o[0], o[1], q, kc, vc, B, T, L, C, NH))
# scores beyond float32 (inputs ~1e20): the rescored path
q, k, v = rand(8, 1e20), rand(8, 1e20), rand(8)
att_n, att_p, out_n, out_p = zeros(4), zeros(4), zeros(8), zeros(8)
P.attention_forward(out_p, att_p, q, k, v, None, 1, 2, 2, 4, 1, 0)
N.attention_forward(out_n, att_n, q, k, v, None, 1, 2, 2, 4, 1, 0)
report("attention_forward huge-scores att", att_n, att_p)
report("attention_forward huge-scores out", out_n, out_p)

# Conv1D: plain, and stride, padding, dilation and groups together
for (B, L, C, OC, KS, stride, pad, dil, groups) in ((2, 9, 3, 4, 3, 1, 0, 1, 1), (2, 11, 4, 6, 3, 2, 2, 2, 2)):
    Lout = (L + 2 * pad - dil * (KS - 1) - 1) // stride + 1
    inp, w, bias = rand(B * L * C), rand(OC * (C // groups) * KS), rand(OC)
    dout = rand(B * Lout * OC)
    tag = "L%d C%d OC%d KS%d s%d p%d d%d g%d" % (L, C, OC, KS, stride, pad, dil, groups)
    both("conv1d_forward " + tag, [zeros(B * Lout * OC)],
         lambda K, o: K.conv1d_forward(o[0], inp, w, bias, B, L, C, Lout, OC, KS, stride, pad, dil, groups))
    both("conv1d_backward " + tag, [rand(B * L * C), rand(OC * (C // groups) * KS), rand(OC)],
         lambda K, o: K.conv1d_backward(o[0], o[1], o[2], dout, inp, w, B, L, C, Lout, OC, KS, stride, pad, dil, groups))

# argmax (ties: the first; NaN never larger), gather_rows
row = array("f", [0.5, 3.0, -1.0, 3.0, 2.0, float("nan"), 1.0])
nanfirst = array("f", [float("nan"), 1.0, 2.0])
print("ERR argmax/return %d" % sum(abs(N.argmax(b_, o_, n_) - P.argmax(b_, o_, n_))
                                   for b_, o_, n_ in ((row, 0, 7), (row, 2, 5), (row, 4, 3), (nanfirst, 0, 3))))
count += 1
srcrows = rand(10 * 3)
both("gather_rows", [zeros(4 * 3)], lambda K, o: K.gather_rows(o[0], srcrows, [9, 2, 2, 0, 5, 7], 1, 4, 3))

# sequence kernels
table, V, C = rand(11 * 6), 11, 6
ids = array("f", [3, 0, 10, 3, 7])
both("embedding_forward", [zeros(5 * 6)], lambda K, o: K.embedding_forward(o[0], ids, table, 5, C, V))
for badid in (11.0, 2.5, -1.0):
    wrong = array("f", [1, 2, badid, 4])
    print("ERR embedding_forward bad-id %g %d" % (badid, abs(N.embedding_forward(zeros(24), wrong, table, 4, C, V)
                                                            - P.embedding_forward(zeros(24), wrong, table, 4, C, V))))
    count += 1
demb = rand(5 * 6)
both("embedding_backward", [rand(11 * 6)], lambda K, o: K.embedding_backward(o[0], demb, ids, 5, C))
pe, x3, d3 = rand(9 * 6), rand(2 * 4 * 6), rand(2 * 4 * 6)
both("posenc_forward", [zeros(48)], lambda K, o: K.posenc_forward(o[0], x3, pe, 2, 4, 6, 3))
both("posembed_backward", [rand(9 * 6)], lambda K, o: K.posembed_backward(o[0], d3, 2, 4, 6, 3))
both("kv_store", [rand(2 * 7 * 6)], lambda K, o: K.kv_store(o[0], x3, 2, 4, 7, 6, 2))
keep = bytearray([1, 0, 1, 1, 0, 0, 1] * 7)
both("dropout_apply", [zeros(48)], lambda K, o: K.dropout_apply(o[0], x3, keep, 48, 1.25))

# activations: every kind, inputs across the interesting range
x = rand(301, 6.0)
x[0] = 0.0
x[1] = -0.0
x[2] = 1e-8
x[3] = -9.5
x[4] = 12.0
dy = rand(301)
for kind, kname in ((RELU, "relu"), (LEAKY_RELU, "leaky_relu"), (GELU, "gelu"), (GELU_TANH, "gelu_tanh"),
                    (TANH, "tanh"), (SIGMOID, "sigmoid")):
    y = zeros(301)
    P.act_forward(y, x, 301, kind)
    both("act_forward " + kname, [zeros(301)], lambda K, o: K.act_forward(o[0], x, 301, kind))
    both("act_backward " + kname, [zeros(301)], lambda K, o: K.act_backward(o[0], dy, x, y, 301, kind))

# pooling, cross-entropy
inp = rand(3 * 5 * 7)
both("avgpool_forward", [zeros(21)], lambda K, o: K.avgpool_forward(o[0], inp, 3, 5, 7))
dpool = rand(21)
both("avgpool_backward", [zeros(105)], lambda K, o: K.avgpool_backward(o[0], dpool, 3, 5, 7))
for scale in (1.0, 30.0):
    logits = rand(6 * 10, scale)
    labels = [0, 3, 9, 5, 5, 1]
    both("crossentropy_softmax x%g" % scale, [zeros(60)], lambda K, o: K.crossentropy_softmax(o[0], logits, labels, 6, 10))

# LayerNorm: a row with an offset, and one whose squares overflow float32
for (Nn, C, shift) in ((4, 16, 3.0), (3, 7, 0.0), (2, 8, 1e20)):
    inp = rand(Nn * C, 2.0)
    for i in range(C):
        inp[i] += shift
    w, bb = rand(C), rand(C)
    dout = rand(Nn * C)
    tag = "%dx%d shift %g" % (Nn, C, shift)
    lp = [w, bb, zeros(Nn), zeros(Nn)]
    ln_n = [w, bb, zeros(Nn), zeros(Nn)]
    out_p, out_n = zeros(Nn * C), zeros(Nn * C)
    P.layernorm_forward(out_p, inp, lp, Nn, C, 1e-5)
    N.layernorm_forward(out_n, inp, ln_n, Nn, C, 1e-5)
    report("layernorm_forward out " + tag, out_n, out_p)
    report("layernorm_forward mean " + tag, ln_n[2], lp[2])
    report("layernorm_forward rstd " + tag, ln_n[3], lp[3])
    if shift < 1e10:
        dwp, dbp = rand(C), rand(C)
        dwn, dbn = array("f", dwp), array("f", dbp)
        dp, dn = zeros(Nn * C), zeros(Nn * C)
        P.layernorm_backward(dp, dout, inp, [w, bb, lp[2], lp[3], dwp, dbp], Nn, C)
        N.layernorm_backward(dn, dout, inp, [w, bb, lp[2], lp[3], dwn, dbn], Nn, C)
        report("layernorm_backward dinp " + tag, dn, dp)
        report("layernorm_backward dweight " + tag, dwn, dwp)
        report("layernorm_backward dbias " + tag, dbn, dbp)

# optimizers: per tensor and the whole step
n = 103
p0, g0, m0, v0 = rand(n), rand(n, 0.1), rand(n, 0.01), rand(n, 0.001)
for i in range(n):
    v0[i] = abs(v0[i])
for wd, dec in ((0.0, 0), (0.01, 0), (0.01, 1)):
    both("adam_update wd%g decoupled%d" % (wd, dec), [p0, m0, v0],
         lambda K, o: K.adam_update(o[0], g0, o[1], o[2], n, 1e-2, 0.9, 0.999, 1e-8, wd, 1 - 0.9 ** 3, 1 - 0.999 ** 3, dec))
for mom in (0.0, 0.9):
    both("sgd_update momentum%g" % mom, [p0, m0 if mom else None],
         lambda K, o: K.sgd_update(o[0], g0, o[1], n, 0.1, mom, 0.01))


def pairs(sizes):
    out = []
    for s in sizes:
        p = mf.Tensor((s,), rand(s))
        g = mf.Tensor((s,), rand(s, 0.1))
        out.append((p, g))
    return out


sizes = (5, 32, 1, 64)
total = sum(sizes)
for kind in ("adam", "sgd"):
    results = []
    for K in (P, N):
        mf.seed(1)
        rng.state = 99
        params = pairs(sizes)
        if kind == "adam":
            olds = [rand(total, 0.01), rand(total, 0.001)]
            for i in range(total):
                olds[1][i] = abs(olds[1][i])
            news = [zeros(total), zeros(total)]
            newp = zeros(total)
            r = K.adam_step(newp, news, params, olds, [1e-2, 0.9, 0.999, 1e-8, 0.01, 1, 4, None])
        else:
            olds = [rand(total, 0.01)]
            news = [zeros(total)]
            newp = zeros(total)
            r = K.sgd_step(newp, news, params, olds, [0.1, 0.9, 0.01, None])
        K.params_commit(params, newp, len(params), None)
        flat = array("f")
        for p, g in params:
            flat.extend(p.data)
        results.append((r, newp, news, flat))
    (r1, np1, ns1, f1), (r2, np2, ns2, f2) = results
    print("ERR %s_step/return %d" % (kind, abs(r1 - r2)))
    count += 1
    report(kind + "_step newp", np2, np1)
    for i in range(len(ns1)):
        report(kind + "_step news%d" % i, ns2[i], ns1[i])
    report("params_commit " + kind, f2, f1)
# a non-finite gradient in the third pair: both name it, and STEP_FROZEN for a frozen pair
params = pairs(sizes)
params[2][1].data[0] = float("nan")
r = [K.sgd_step(zeros(total), [], params, [], [0.1, 0.0, 0.0, None]) for K in (P, N)]
print("ERR sgd_step nonfinite-index %d" % (abs(r[0] - r[1]) + abs(r[1] - 2)))
count += 1


class _Frozen:                  # a grad slot without a buffer (a parameter frozen after the optimizer was made)
    data = None


params[1] = (params[1][0], _Frozen())
r = [K.sgd_step(zeros(total), [], params, [], [0.1, 0.0, 0.0, None]) for K in (P, N)]
print("ERR sgd_step frozen %d" % abs(r[0] - r[1]))
count += 1
print("DONE %d" % count)
