# The shared scratch arena (layer.Scratch): runs under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/scratch_mp.py [BACKEND]
# prints one line per case and raises AssertionError on the first failure.
#
# Per model (two EncoderBlocks, pre-norm and post-norm, the second with ffn.recompute off, with and
# without LoRA adapters, frozen parts): three training steps at batch 4, 3 and 4 give bit for bit the gradients (every
# parameter's and the input's) of the same steps run with every buffer an array of its own (the
# arena switched off). Two buffers that are live at once and share an element would change a
# gradient. The blocks share one arena (it holds less than their own buffers would), a block's
# scratch buffers stay where they are from step to step (no placement per step), and a backward
# that raises inside a block leaves no frame open.
import sys

import microformer as mf
from microformer import layer as L

MICRO = sys.implementation.name == "micropython"
if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])          # else the interpreter's default (viper, numpy)


def _x(shape, seed):
    rng = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(-1.0, 1.0)
    return t


def _model(norm_first, lora, freeze):
    mf.seed(5)
    m = mf.Sequential([mf.Dense(6, 16), mf.Reshape((4, 4)),
                       mf.EncoderBlock(4, 2, 12, activation="relu", norm_first=norm_first),
                       mf.EncoderBlock(4, 2, 12, activation="relu", norm_first=norm_first),
                       mf.GlobalAvgPool(), mf.Dense(4, 3)])
    m[3].ffn.recompute = False         # the upper block keeps its activation output (the lower one, by
                                       # default, computes it again in backward)
    if lora:
        mf.add_lora(m, rank=2, alpha=4)
        m[-1].trainable = True
    if freeze:
        m[2].attn.trainable = False
        m[3].ffn.fc1.trainable = False
    # nonzero adapters, so that their gradients reach every part
    for p, _ in m.params():
        if p.name.endswith("lora_B"):
            for i in range(p.size):
                p.data[i] = 0.1 * ((i % 5) - 2)
    return m


def _steps(m):
    # three steps; returns the bytes of every gradient and input gradient after each
    out = []
    for k, B in enumerate((4, 3, 4)):
        for _, g in m.params():
            if g.data is not None:
                g.fill(0.0)
        x = _x((B, 6), 10 + k)
        y = m.forward(x)
        dx = m.backward(_x(y.shape, 20 + k), need_dx=True)
        got = [bytes(dx.data)]
        for _, g in m.params():
            got.append(None if g.data is None else bytes(g.data))
        out.append(got)
    return out


def _own_buffers(fn):
    # fn() with the arena switched off: every scratch buffer an array of its own
    enter = L.scratch.enter
    L.scratch.enter = lambda: None
    try:
        return fn()
    finally:
        L.scratch.enter = enter
        L.scratch.depth = 0


def _scratch_floats(m):
    # floats of the scratch buffers the blocks' parts hold (own arrays or views)
    n = 0
    for blk in (m[2], m[3]):
        for part in (blk, blk.ln1, blk.attn, blk.ln2, blk.ffn.fc1, blk.ffn.act, blk.ffn.fc2):
            k = getattr(part, "_bwd", None)
            if k is not None:
                for e in k.scr:
                    n += e[2]
    return n


def check(norm_first, lora, freeze):
    name = "norm_first=%s lora=%s freeze=%s" % (norm_first, lora, freeze)
    L.scratch.free()
    ref = _own_buffers(lambda: _steps(_model(norm_first, lora, freeze)))
    m = _model(norm_first, lora, freeze)
    _own_buffers(lambda: _steps(m))
    own = _scratch_floats(m)
    L.scratch.free()
    m = _model(norm_first, lora, freeze)
    got = _steps(m)
    assert L.scratch.depth == 0, name
    for s in range(len(ref)):
        for i in range(len(ref[s])):
            assert got[s][i] == ref[s][i], "%s: step %d, gradient %d differs with the shared arena" % (name, s, i)
    arena = L.scratch.nbytes() // 4
    assert 0 < arena < own, "%s: the arena holds %d floats, the blocks' own buffers %d" % (name, arena, own)
    # steady state: the same scratch Tensors step after step (nothing placed again)
    held = [m[2].attn._dQ, m[3].attn._dQ, m[2]._dx1, m[2].ffn._h]
    m.backward(_x(m[-1]._y.shape, 30), need_dx=True)
    now = [m[2].attn._dQ, m[3].attn._dQ, m[2]._dx1, m[2].ffn._h]
    for a, b in zip(held, now):
        assert a is b, "%s: a scratch buffer was placed again in a steady-state step" % name
    print("scratch %s: bit-identical, arena %d floats for %d of own buffers" % (name, arena, own))


def check_shared():
    # one block or three: the same arena (the blocks share it; it is as large as one frame)
    sizes = []
    for k in (1, 3):
        L.scratch.free()
        mf.seed(5)
        blocks = [mf.EncoderBlock(8, 2, 24) for _ in range(k)]
        m = mf.Sequential([mf.Dense(6, 32), mf.Reshape((4, 8))] + blocks + [mf.GlobalAvgPool(), mf.Dense(8, 3)])
        for B in (4, 3, 4):
            y = m.forward(_x((B, 6), 40 + B))
            m.backward(_x(y.shape, 50 + B), need_dx=True)
        sizes.append(L.scratch.nbytes())
    assert sizes[0] == sizes[1] > 0, "arena bytes with 1 and 3 blocks: %r" % sizes
    print("scratch shared: 1 and 3 blocks hold an arena of %d bytes" % sizes[0])


def check_frozen_dense():
    # a frozen Dense keeps its input by reference (no copy) and no buffer but its output; its
    # input gradient is a scratch buffer (in a block's backward: the arena's)
    L.scratch.free()
    mf.seed(5)
    blk = mf.EncoderBlock(8, 2, 24)
    blk.ffn.fc1.trainable = False
    fc1 = blk.ffn.fc1
    x = _x((2, 4, 8), 60)
    y = blk.forward(x)
    assert fc1._x is blk._y, "the frozen Dense holds something else than its input itself (LayerNorm2 writes it into the block's _y)"
    assert fc1._fwd.names == ["_y"], fc1._fwd.names
    blk.backward(_x(y.shape, 61))
    k = fc1._bwd
    assert k.names == ["_dx"] and k.ci >= 0 and not k.floats, "the frozen Dense's dx is not the arena's"
    print("scratch frozen Dense: input by reference, output its only own buffer, dx in the arena")
    try:
        mf.FeedForward(8, 16).recompute = True
        raise AssertionError("a FeedForward outside a block took recompute")
    except ValueError:
        pass


def check_interrupted():
    # a backward that raises inside a block leaves no frame open, and the next one is right
    L.scratch.free()
    m = _model(True, False, False)
    ref = _own_buffers(lambda: _steps(_model(True, False, False)))
    ffn = m[3].ffn
    real = ffn.backward

    def boom(dy, grads=True, need_dx=True):
        raise KeyboardInterrupt
    ffn.backward = boom
    y = m.forward(_x((4, 6), 99))
    try:
        m.backward(_x(y.shape, 98))
        raise AssertionError("the backward did not raise")
    except KeyboardInterrupt:
        pass
    assert L.scratch.depth == 0, "a frame was left open by an interrupted backward"
    ffn.backward = real
    got = _steps(m)
    assert got == ref, "the steps after an interrupted backward differ"
    print("scratch interrupted: no frame left open, next steps bit-identical")


def check_dropout():
    # a block with dropout: the input gradients of its two dropouts are the arena's (read by the
    # part below, inside the block's backward), the FFN's dropout backward runs in place on the
    # second linear's input gradient (no buffer at all), and the block's two dropouts drop in place
    # over the attention's and the FFN's outputs (no output buffer); the steps are those with own
    # buffers
    for norm_first in (True, False):
        def make():
            mf.seed(5)
            return mf.Sequential([mf.Dense(6, 16), mf.Reshape((4, 4)),
                                  mf.EncoderBlock(4, 2, 12, activation="relu", norm_first=norm_first, dropout=0.25),
                                  mf.GlobalAvgPool(), mf.Dense(4, 3)])
        L.scratch.free()
        ref = _own_buffers(lambda: _steps(make()))
        L.scratch.free()
        m = make()
        got = _steps(m)
        assert got == ref, "dropout norm_first=%s: the steps differ with the shared arena" % norm_first
        blk = m[2]
        for name, d in (("drop1", blk.drop1), ("drop2", blk.drop2)):
            k = d._bwd
            assert k.scr and k.ci >= 0 and not k.floats, \
                "dropout norm_first=%s: %s's input gradient is not the arena's" % (norm_first, name)
        assert getattr(blk.ffn.drop, "_bwd", None) is None, "the FFN's dropout made an input gradient buffer"
        assert blk.drop1._y is None and blk.drop2._y is None, "the block's dropouts keep outputs of their own"
    print("scratch dropout: the block's dropouts in place or in the arena, bit-identical")


def main():
    n = 0
    for norm_first in (True, False):
        for lora in (False, True):
            for freeze in (False, True):
                check(norm_first, lora, freeze)
                n += 1
    check_shared()
    check_frozen_dense()
    check_interrupted()
    check_dropout()
    print("SCRATCH OK %d (%s)" % (n + 4, mf.get_backend()))


main()
