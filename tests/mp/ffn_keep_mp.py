# What an EncoderBlock's FeedForward and LayerNorms (and a first Conv1D, an Attention's backward
# item by item) keep for backward
# (FeedForward.recompute, on by default in a block): runs under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/ffn_keep_mp.py [BACKEND]
# prints one line per case and raises AssertionError on the first failure.
#
# Per activation kind, norm_first, and mode (full, LoRA, the second linear frozen, dropout): two
# steps of a model whose block computes its activation output again in backward give bit for bit
# the output, the input gradient and every parameter gradient of the same model with the output
# kept (recompute=False); the floats the layers keep in arrays of their own are B*S*hidden fewer,
# and with the shared scratch arena fewer in all; cache_floats declares the difference. A block
# recomputes by default, but for tanh and sigmoid (their backward reads the output: recomputing it
# saves nothing there; it is still allowed and bit-identical).
import sys

import microformer as mf
from microformer import layer as L

if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])          # else the interpreter's default (viper, numpy)

KINDS = ("relu", "leaky_relu", "gelu", "gelu_tanh", "tanh", "sigmoid")
MODES = ("full", "lora", "frozen_fc2", "dropout")
S = 5
E = 8
F = 24


def _x(shape, seed):
    rng = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(-1.5, 1.5)
    return t


def _model(kind, norm_first, mode, recompute):
    mf.seed(11)
    blk = mf.EncoderBlock(E, 2, F, activation=kind, norm_first=norm_first,
                          dropout=0.25 if mode == "dropout" else 0.0)
    m = mf.Sequential([mf.Dense(3, S * E), mf.Reshape((S, E)), blk, mf.GlobalAvgPool(), mf.Dense(E, 4)])
    if mode == "lora":
        mf.add_lora(m, rank=2, alpha=4)
        m[-1].trainable = True
        for p, _ in m.params():            # nonzero adapters: their gradients reach every part
            if p.name.endswith("lora_B"):
                for i in range(p.size):
                    p.data[i] = 0.1 * ((i % 5) - 2)
    elif mode == "frozen_fc2":
        blk.ffn.fc2.trainable = False
    if recompute is not None:               # None: the block's default
        blk.ffn.recompute = recompute
    return m


def _steps(m):
    # two steps (batch 3, then 2): the bytes of the output, the input gradient and every gradient
    out = []
    for k, B in enumerate((3, 2)):
        for _, g in m.params():
            if g.data is not None:
                g.fill(0.0)
        y = m.forward(_x((B, 3), 10 + k))
        dx = m.backward(_x(y.shape, 20 + k), need_dx=True)
        got = [bytes(y.data), bytes(dx.data)]
        for _, g in m.params():
            got.append(None if g.data is None else bytes(g.data))
        out.append(got)
    return out


def own_floats(obj, seen=None):
    """Floats of the arrays of its own that every stage of every layer (and adapter) inside obj
    holds (Buffered._stages: what a layer keeps between passes; scratch views are the arena's)."""
    if seen is None:
        seen = {}
    if id(obj) in seen:
        return 0
    seen[id(obj)] = 1
    n = 0
    st = getattr(obj, "_stages", None)
    if st:
        for stage in st:
            for a in st[stage][0]:
                n += len(a)
    d = getattr(obj, "__dict__", None) or {}
    for name in d:
        v = d[name]
        if isinstance(v, L.Buffered):
            n += own_floats(v, seen)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, L.Buffered):
                    n += own_floats(x, seen)
    return n


def _run(kind, norm_first, mode, recompute):
    L.scratch.free()
    m = _model(kind, norm_first, mode, recompute)
    got = _steps(m)
    return got, own_floats(m), L.scratch.nbytes() // 4, m[2].ffn.cache_floats((2, S, E)), m


def check(kind, norm_first, mode):
    name = "%s norm_first=%s %s" % (kind, norm_first, mode)
    ref, own_off, arena_off, decl_off, _ = _run(kind, norm_first, mode, False)
    got, own_on, arena_on, decl_on, m = _run(kind, norm_first, mode, True)
    assert m[2].ffn.recompute and not m[2].ffn.act._fwd.floats, "%s: the activation output is kept" % name
    for s in range(len(ref)):
        for i in range(len(ref[s])):
            assert got[s][i] == ref[s][i], "%s: step %d, value %d differs from the kept output's" % (name, s, i)
    hidden = 3 * S * F                      # the largest batch's [B,S,hidden]
    assert own_on == own_off - hidden, "%s: own floats %d with recompute, %d without" % (name, own_on, own_off)
    out = kind in ("tanh", "sigmoid")
    default = _model(kind, norm_first, mode, None)[2].ffn.recompute
    assert default is not out, "%s: recompute is %r by default in a block" % (name, default)
    if out:                                 # allowed and right, but no smaller
        print("ffn keep %s: bit-identical (not the default)" % name)
        return
    # the arena is a list of chunks placed first fit (layer.Scratch): the order of the buffers moves
    # its size a little; own arrays and arena together hold fewer floats (tanh, sigmoid: not more)
    assert own_on + arena_on < own_off + arena_off, \
        "%s: own + arena floats %d + %d with recompute, %d + %d without" % (name, own_on, arena_on, own_off,
                                                                           arena_off)
    want = 2 * S * F                        # declared at B=2
    assert decl_off - decl_on == want, "%s: cache_floats %d with recompute, %d without" % (name, decl_on, decl_off)
    print("ffn keep %s: bit-identical, own floats %d -> %d, arena %d -> %d" % (name, own_off, own_on,
                                                                               arena_off, arena_on))


def _composed(blk):
    # the pre-norm block's math from parts of their own, with the block's weights: LayerNorms that
    # keep their outputs, an Attention and a FeedForward outside any block (it keeps the activation
    # output); the same kernels in the same order
    ln1 = mf.LayerNorm(E)
    ln2 = mf.LayerNorm(E)
    attn = mf.Attention(E, 2)
    ffn = mf.FeedForward(E, F, blk.ffn.kind)
    for mine, theirs in ((ln1, blk.ln1), (attn, blk.attn), (ln2, blk.ln2), (ffn, blk.ffn)):
        mine.load_state_dict(theirs.state_dict())
        mine.trainable = theirs.trainable
    ffn.fc1.trainable = blk.ffn.fc1.trainable
    return ln1, attn, ln2, ffn


def _composed_step(parts, x, dy):
    ln1, attn, ln2, ffn = parts
    K = mf.backend.K
    x1 = mf.Tensor(x.shape)
    K.add_forward(x1.data, x.data, attn.forward(ln1.forward(x)).data, x.size)
    y = mf.Tensor(x.shape)
    K.add_forward(y.data, x1.data, ffn.forward(ln2.forward(x1)).data, x.size)
    dx1 = mf.Tensor(x.shape)
    K.add_forward(dx1.data, dy.data, ln2.backward(ffn.backward(dy)).data, x.size)
    dx = mf.Tensor(x.shape)
    K.add_forward(dx.data, dx1.data, ln1.backward(attn.backward(dx1)).data, x.size)
    got = [bytes(y.data), bytes(dx.data)]
    for part in parts:
        for _, g in part.params():
            got.append(None if g.data is None else bytes(g.data))
    return got


def check_prenorm(kind, mode):
    # a pre-norm block keeps no LayerNorm output (its forward writes them into its x1 and y buffers,
    # its backward computes them again where a part's grads read them): outputs and gradients bit
    # for bit those of the same math from parts that keep theirs; cache_floats declares it
    name = "pre-norm %s %s" % (kind, mode)
    L.scratch.free()
    mf.seed(13)
    blk = mf.EncoderBlock(E, 2, F, activation=kind)
    if mode == "frozen_attn":
        blk.attn.trainable = False
    elif mode == "frozen_fc1":
        blk.ffn.fc1.trainable = False
    parts = _composed(blk)
    for k, B in enumerate((3, 2, 3)):
        for p in [blk] + list(parts):
            for _, g in p.params():
                if g.data is not None:
                    g.fill(0.0)
        x = _x((B, S, E), 30 + k)
        dy = _x((B, S, E), 40 + k)
        y = blk.forward(x)
        dx = blk.backward(dy)
        got = [bytes(y.data), bytes(dx.data)] + [None if g.data is None else bytes(g.data) for _, g in blk.params()]
        want = _composed_step(parts, x, dy)
        assert len(got) == len(want), name
        for i in range(len(got)):
            assert got[i] == want[i], "%s: step %d, value %d differs from the parts' that keep their outputs" % (
                name, k, i)
    for ln in (blk.ln1, blk.ln2):
        assert "_out" not in ln._stages, "%s: a LayerNorm keeps an output buffer of its own" % name
    for bad, what in ((mf.Tensor((3, S, E + 1)), "out must be"), ([0.0], "out must be a Tensor")):
        try:
            blk.ln1.forward_into(_x((3, S, E), 70), bad)
            raise AssertionError("%s: forward_into took %r" % (name, bad))
        except ValueError as e:
            assert what in str(e), str(e)
    n = 2 * S * E
    post = mf.EncoderBlock(E, 2, F, activation=kind, norm_first=False)
    assert post.cache_floats((2, S, E)) - blk.cache_floats((2, S, E)) == n, name
    print("ffn keep %s: bit-identical, no LayerNorm output kept" % name)


def check_conv_first():
    # a Conv1D that is a model's first layer: train.fit's backward (need_dx=False) makes no input
    # gradient and no buffer for it; the weight grads are bit for bit those of a backward that does
    name = "Conv1D first layer"
    grads = []
    for need in (True, False):
        mf.seed(17)
        m = mf.Sequential([mf.Conv1D(3, 4, 3), mf.GlobalAvgPool(), mf.Dense(4, 2)])
        y = m.forward(_x((2, 7, 3), 50))
        dx = m.backward(_x(y.shape, 51), need_dx=need)
        assert (dx is None) is (not need), name
        assert ("_bwd" in (m[0]._stages or {})) is need, "%s: need_dx=%r, stages %r" % (name, need, m[0]._stages)
        grads.append([bytes(g.data) for _, g in m.params()])
    assert grads[0] == grads[1], "%s: the weight grads differ without the input gradient" % name
    print("ffn keep %s: no input gradient and no buffer for it, the same weight grads" % name)


def check_attention_items():
    # the stored path's backward item by item: gradients bit for bit those of one call over the
    # batch (Attention._back_items None), with and without a padding mask, causal or not; on viper
    # the kernels' dA / dS block is one item's, not the batch's
    import sys as _sys
    for causal in (False, True):
        for masked in (False, True):
            name = "Attention items causal=%s mask=%s" % (causal, masked)
            got = []
            for items in (False, True):
                L.drop_scratch()
                mf.seed(19)
                a = mf.Attention(E, 2, causal=causal)
                a._back_items = 0 if items else None    # item by item whatever the size / one call
                x = _x((3, S, E), 60)
                mask = [[0] * S, [0] * (S - 2) + [1, 1], [0] + [1] * (S - 1)] if masked else None
                y = a.forward(x, key_padding_mask=mask)
                dx = a.backward(_x(y.shape, 61))
                got.append([bytes(y.data), bytes(dx.data)] + [bytes(g.data) for _, g in a.params()])
                vc = _sys.modules.get("microformer.viper_common")
                if items and vc is not None and mf.get_backend() == "viper":
                    n = len(vc._F[0])
                    assert n < 3 * 2 * S * S, "%s: the viper dA block holds %d floats for a batch of 3" % (name, n)
            assert got[0] == got[1], "%s: the item-by-item backward differs from the batch's" % name
            print("ffn keep %s: bit-identical to the batch's backward" % name)


def main():
    n = 0
    for kind in KINDS:
        if kind == "gelu" and mf.actkind.erf is None:
            continue
        for norm_first in (True, False):
            for mode in MODES:
                check(kind, norm_first, mode)
                n += 1
    for kind in ("relu", "gelu_tanh", "sigmoid"):
        for mode in ("full", "frozen_attn", "frozen_fc1"):
            check_prenorm(kind, mode)
            n += 1
    check_conv_first()
    check_attention_items()
    n += 5
    print("FFN KEEP OK %d (%s)" % (n, mf.get_backend()))


main()
