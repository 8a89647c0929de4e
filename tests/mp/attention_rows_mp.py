# The viper attention backward of one large item in pieces of query rows (viper_softmax: above
# PIECE floats of weights, dS written over the weights, dA made a few rows at a time) against the
# same backward in one block: dq, dk, dv bit for bit, masked, causal or neither, one head or
# several, any piece height (one row when a row alone exceeds PIECE); its scratch is one piece,
# not the block. Then an Attention layer on the backend given: weights() and stages() refuse
# after a backward, and a second backward of one forward gives the first one's gradients again.
# Runs inside MicroPython (the kernel checks need the viper backend) and under CPython (the layer
# checks only):
#   MICROPYPATH=lib:tests/mp micropython tests/mp/attention_rows_mp.py [BACKEND]
# prints one line per check and raises AssertionError on the first failure.
import sys
from array import array

import microformer as mf

if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])


def _fill(n, seed, scale=1.0):
    r = mf.Rng(seed)
    a = array("f", [0.0] * n)
    for i in range(n):
        a[i] = r.signed_unit() * scale
    return a


def kernels():
    from microformer import viper_common as vc
    from microformer import viper_softmax as vs
    n = 0
    # (Tq, Tk, C, NH, causal, masked keys): pieces of several rows, a last piece shorter, one
    # row per piece (Tk alone above PIECE), heads of 1 to 4, Tq != Tk
    for Tq, Tk, C, NH, causal, masked in ((46, 46, 16, 2, 0, 0), (33, 40, 8, 2, 1, 0), (50, 50, 12, 3, 0, 3),
                                         (70, 70, 4, 1, 1, 0), (3, 1100, 4, 2, 0, 5), (20, 64, 16, 4, 1, 2)):
        assert NH * Tq * Tk > vs.PIECE, "case %r does not take the rows path" % ((Tq, Tk, C, NH),)
        seed = Tq + Tk + C
        q, k, v, dout = (_fill(Tq * C, seed), _fill(Tk * C, seed + 1), _fill(Tk * C, seed + 2),
                         _fill(Tq * C, seed + 3, 3.0))
        mask = None
        if masked:
            mask = bytearray(Tk)
            for j in range(masked):
                mask[(7 * j + 1) % Tk] = 1
        att = array("f", [0.0] * (NH * Tq * Tk))
        vs.attention_forward(array("f", [0.0] * (Tq * C)), att, q, k, v, mask, 1, Tq, Tk, C, NH, causal)
        got = []
        for f in (vs.attention_backward_block, vs.attention_backward_rows, vs.attention_backward):
            a = array("f", att)
            grads = (array("f", [0.0] * (Tq * C)), array("f", [0.0] * (Tk * C)), array("f", [0.0] * (Tk * C)))
            vc._F[0] = array("f", [0.0] * 64)           # the kernels' float scratch from its smallest
            if f is vs.attention_backward:
                f(grads[0], grads[1], grads[2], None, dout, a, q, k, v, 1, Tq, Tk, C, NH)
            else:
                f(grads[0], grads[1], grads[2], dout, a, q, k, v, 1, Tq, Tk, C, NH)
            got.append((bytes(grads[0]), bytes(grads[1]), bytes(grads[2]), len(vc._F[0])))
        block, rows, entry = got
        assert max(abs(x) for x in array("f", block[1])) > 0.0, "no key gradient: the case checks nothing"
        for i, name in enumerate(("dq", "dk", "dv")):
            assert rows[i] == block[i], "%s of the rows path differs from the block's at %r" % (name, (Tq, Tk, C, NH))
            assert entry[i] == block[i], "%s of attention_backward differs at %r" % (name, (Tq, Tk, C, NH))
        # the scratch: the block path grows it to the whole (NH, Tq, Tk); the entry point to a piece
        assert block[3] >= NH * Tq * Tk, block[3]
        assert entry[3] < NH * Tq * Tk // 2, "attention_backward grew its scratch to %d floats for %d weights" % (
            entry[3], NH * Tq * Tk)
        print("rows == block", Tq, Tk, C, NH, causal, masked, "scratch", entry[3], "of", block[3])
        n += 1
    n += _dropout_scratch(vc, vs)
    try:
        vs.attention_backward_rows(None, None, None, None, None, None, None, None, 2, 4, 4, 4, 1)
        raise AssertionError("attention_backward_rows took B=2")
    except ValueError as e:
        assert "B must be 1" in str(e), e
    return n


def _dropout_scratch(vc, vs):
    # the dropped weights' backward in one block of the module scratch, the one its forward
    # (attention_context) fills at exactly its size: the float scratch of the other backward
    # paths stays as it was.
    # With every weight kept and a scale of 1 it is the one-block backward, bit for bit
    B, T, C, NH = 2, 30, 8, 2
    n = B * NH * T * T
    q, k, v, dout = _fill(B * T * C, 1), _fill(B * T * C, 2), _fill(B * T * C, 3), _fill(B * T * C, 4, 3.0)
    att = array("f", [0.0] * n)
    vs.attention_forward(array("f", [0.0] * (B * T * C)), att, q, k, v, None, B, T, T, C, NH, 0)
    keep = bytearray(b"\x01" * n)
    vc._G[0] = array("f", [0.0] * 64)
    vs.attention_context(array("f", [0.0] * (B * T * C)), att, keep, v, B, T, T, C, NH, 1.0)
    got = []
    for f in (vs.attention_backward_block, vs.attention_backward_dropout):
        grads = [array("f", [0.0] * (B * T * C)) for _ in range(3)]
        vc._F[0] = array("f", [0.0] * 64)
        if f is vs.attention_backward_block:
            f(grads[0], grads[1], grads[2], dout, array("f", att), q, k, v, B, T, T, C, NH)
        else:
            f(grads[0], grads[1], grads[2], None, dout, array("f", att), keep, q, k, v, B, T, T, C, NH, 1.0)
        got.append([bytes(g) for g in grads] + [len(vc._F[0]), len(vc._G[0])])
    block, drop = got
    for i, name in enumerate(("dq", "dk", "dv")):
        assert drop[i] == block[i], "%s of the dropout backward (all kept, scale 1) differs from the block's" % name
    assert block[3] >= n, block[3]
    assert drop[4] == n, "the dropped weights' scratch _G holds %d floats for %d weights" % (drop[4], n)
    assert drop[3] == 64, "the dropout backward grew the float scratch _F to %d floats besides _G's %d" % (
        drop[3], drop[4])
    print("dropout backward: one block of scratch (_G %d floats, _F untouched), == the block path" % drop[4])
    return 1


def _x(shape, seed):
    t = mf.Tensor(shape)
    t.data[:] = _fill(t.size, seed)
    return t


def _refused(f, what):
    try:
        f()
    except ValueError as e:
        assert "backward has run" in str(e), e
        return
    raise AssertionError("%s ran after a backward" % what)


def layer():
    # S = 46 with 2 heads: 4232 weights for one item, the rows path on the viper backend
    out = []
    for twice in (False, True):
        mf.seed(3)
        a = mf.Attention(8, 2, causal=twice)
        x = _x((1, 46, 8), 5)
        dy = _x((1, 46, 8), 6)
        for k in range(2):
            for _, g in a.params():
                g.fill(0.0)
            a.forward(x)
            assert len(a.weights(0, 1)) == 46
            dx = a.backward(dy)
            got = [bytes(dx.data)] + [bytes(g.data) for _, g in a.params()]
            if twice:
                _refused(lambda: a.weights(0, 0), "weights()")
                _refused(lambda: a.stages(), "stages()")
                dx = a.backward(dy)                     # a second backward of the same forward
                again = [bytes(dx.data)] + [bytes(g.data) for _, g in a.params()]
                assert again[0] == got[0], "the second backward's dx differs from the first's"
                for i in range(1, len(got)):
                    g1 = array("f", got[i])
                    g2 = array("f", again[i])
                    assert all(g2[j] == 2 * g1[j] for j in range(len(g1))), "grads of two backwards are not twice one's"
            out.append(got)
        a.forward(x)
        assert len(a.weights(0, 1)) == 46                # a forward brings them back
    assert out[0] == out[1] and out[2] == out[3], "two steps of one forward and backward each differ"
    print("layer: weights() refused after a backward, a second backward adds the same gradients")


n = kernels() if mf.get_backend() == "viper" else 0
layer()
print("ATTENTION ROWS OK %d (%s)" % (n, mf.get_backend()))
