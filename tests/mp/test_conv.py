"""Conv1D, MaxPool1D, AvgPool1D, LearnedPositionalEmbedding from three sides: the NumPy reference
(gradchecked), the layers (CPython on the portable and NumPy backends, MicroPython on the portable
and viper backends, both interpreters), real torch modules through state_dict; and bad input."""
import array
import os

import numpy as np
import pytest

import helpers
import reference as ref
from helpers import f32
import microformer as mf

RNG = np.random.default_rng(13)
VIPER_TOL = 2e-3          # the viper conv's documented bound, at the sizes below (kernels_viper.py)


def _fd_close(analytic, numeric):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


# ---- the reference against finite differences --------------------------------------------------

CONV_CONFIGS = [  # Cin, Cout, k, stride, padding, dilation, groups, L
    (3, 4, 3, 1, 0, 1, 1, 7),
    (4, 6, 3, 2, 2, 2, 2, 9),
    (4, 8, 5, 1, 2, 1, 4, 8),     # depthwise, two filters per channel
    (2, 3, 1, 3, 0, 1, 1, 7),
    (3, 2, 4, 3, 3, 1, 1, 4),     # padding wider than the input's tail: taps in the padding
]


@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=[str(c) for c in CONV_CONFIGS])
def test_reference_conv1d_grads(cfg):
    Cin, Cout, k, s, p, d, g, L = cfg
    x = RNG.normal(size=(2, L, Cin))
    W = RNG.normal(size=(Cout, Cin // g, k))
    b = RNG.normal(size=Cout)
    y, cache = ref.conv1d_forward(x, W, b, s, p, d, g)
    dy = RNG.normal(size=y.shape)
    dx, dW, db = ref.conv1d_backward(dy, cache)
    f = lambda: ref.conv1d_forward(x, W, b, s, p, d, g)[0]
    _fd_close(dx, ref.gradcheck(f, x, dy))
    _fd_close(dW, ref.gradcheck(f, W, dy))
    _fd_close(db, ref.gradcheck(f, b, dy))


@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), (4, 1, 2)])
def test_reference_pool_grads(k, s, p):
    x = RNG.permutation(60).reshape(2, 10, 3) / 7.0      # distinct values: max is differentiable
    y, cache = ref.maxpool1d_forward(x, k, s, p)
    dy = RNG.normal(size=y.shape)
    _fd_close(ref.maxpool1d_backward(dy, cache), ref.gradcheck(lambda: ref.maxpool1d_forward(x, k, s, p)[0], x, dy))
    y = ref.avgpool1d_forward(x, k, s, p)
    dy = RNG.normal(size=y.shape)
    _fd_close(ref.avgpool1d_backward(dy, 10, k, s, p), ref.gradcheck(lambda: ref.avgpool1d_forward(x, k, s, p), x, dy))


def test_reference_posembed_grads():
    x, W = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(6, 4))
    dy = RNG.normal(size=(2, 3, 4))
    dx, dW = ref.learned_posembed_backward(dy, 6, start=2)
    f = lambda: ref.learned_posembed_forward(x, W, start=2)
    _fd_close(dx, ref.gradcheck(f, x, dy))
    _fd_close(dW, ref.gradcheck(f, W, dy))


# ---- cases: the layers vs the reference ----------------------------------------------------------

def _spec(a):
    return {"shape": list(a.shape), "data": [float(v) for v in a.ravel()]}


def conv_case(cfg, B=2, bias=True, repeat=1, scale=1.0):
    Cin, Cout, k, s, p, d, g, L = cfg
    x = f32(RNG.normal(size=(B, L, Cin)) * scale)
    W = f32(RNG.normal(scale=0.5, size=(Cout, Cin // g, k)))
    b = f32(RNG.normal(size=Cout)) if bias else None
    y, cache = ref.conv1d_forward(x, W, b, s, p, d, g)
    dy = f32(RNG.normal(size=y.shape))
    dx, dW, db = ref.conv1d_backward(dy, cache)
    want = {"y": y, "dx": dx, "dW": repeat * dW}
    params = {"W": W}
    if bias:
        want["db"] = repeat * db
        params["b"] = b
    case = {"layer": {"type": "Conv1D", "args": [Cin, Cout, k],
                      "kwargs": {"stride": s, "padding": p, "dilation": d, "groups": g, "use_bias": bias}},
            "params": {n: [float(v) for v in a.ravel()] for n, a in params.items()},
            "x": _spec(x), "dy": _spec(dy), "repeat": repeat}
    return "Conv1D%s%s%s" % (list(cfg), "" if bias else " nobias", " x%d" % repeat if repeat > 1 else ""), case, want


def pool_case(kind, k, s, p, B=2, L=10, C=3, ties=False):
    x = RNG.integers(0, 3, size=(B, L, C)) * 0.5 if ties else RNG.normal(size=(B, L, C))
    x = f32(x)
    if kind == "MaxPool1D":
        y, cache = ref.maxpool1d_forward(x, k, s, p)
        dy = f32(RNG.normal(size=y.shape))
        dx = ref.maxpool1d_backward(dy, cache)
    else:
        y = ref.avgpool1d_forward(x, k, s, p)
        dy = f32(RNG.normal(size=y.shape))
        dx = ref.avgpool1d_backward(dy, L, k, s, p)
    case = {"layer": {"type": kind, "args": [k], "kwargs": {"stride": s, "padding": p}},
            "x": _spec(x), "dy": _spec(dy)}
    return "%s k%d s%s p%d%s" % (kind, k, s, p, " ties" if ties else ""), case, {"y": y, "dx": dx}


def posembed_case(max_len=7, S=4, E=5, start=2, repeat=2):
    x = f32(RNG.normal(size=(2, S, E)))
    W = f32(RNG.normal(size=(max_len, E)))
    dy = f32(RNG.normal(size=(2, S, E)))
    dx, dW = ref.learned_posembed_backward(dy, max_len, start)
    case = {"layer": {"type": "LearnedPositionalEmbedding", "args": [max_len, E]},
            "params": {"W": [float(v) for v in W.ravel()]}, "x": _spec(x), "dy": _spec(dy),
            "start": start, "repeat": repeat}
    return "LearnedPositionalEmbedding start%d x%d" % (start, repeat), case, {
        "y": ref.learned_posembed_forward(x, W, start), "dx": dx, "dW": repeat * dW}


def all_cases():
    out = [conv_case(c) for c in CONV_CONFIGS]
    out.append(conv_case((6, 6, 5, 1, 2, 1, 6, 12), bias=False))          # depthwise, no bias
    out.append(conv_case((4, 6, 3, 1, 1, 1, 1, 6), repeat=2))              # grads accumulate
    out.append(conv_case((6, 16, 5, 1, 2, 1, 1, 40), B=3, scale=3.0))     # sensor-demo shape
    for kind in ("MaxPool1D", "AvgPool1D"):
        for k, s, p in ((2, None, 0), (3, 2, 1), (4, 1, 2)):
            out.append(pool_case(kind, k, s, p))
        out.append(pool_case(kind, 3, 1, 1, ties=True))
    out.append(posembed_case())
    return out


CASES = all_cases()
IDS = [c[0] for c in CASES]


def _run_cpython(case, backend):
    import driver_mp
    mf.set_backend(backend)
    try:
        return driver_mp.run_case(dict(case))
    finally:
        mf.set_backend("numpy")


@pytest.mark.parametrize("backend", ["python", "numpy"])
@pytest.mark.parametrize("name,case,want", CASES, ids=IDS)
def test_layer_vs_reference_cpython(name, case, want, backend):
    helpers.check_outputs(_run_cpython(case, backend), want, 1e-4, "%s %s" % (backend, name))


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_layer_vs_reference_micropython(tmp_path, micropython, backend):
    results = helpers.run_cases_micropython([c for _, c, _ in CASES], tmp_path, backend, exe=micropython)
    assert len(results) == len(CASES)
    tol = 1e-4 if backend == "python" else VIPER_TOL
    for (name, _, want), got in zip(CASES, results):
        helpers.check_outputs(got, want, tol, "%s %s %s" % (os.path.basename(micropython), backend, name))


def test_numpy_pool_positions_match_portable():
    # MaxPool1D's argmax buffer on ties: both backends pick the first maximum
    x = mf.Tensor((1, 6, 1), array.array("f", [1.0, 2.0, 2.0, 0.0, 2.0, 2.0]))
    got = {}
    for which in ("python", "numpy"):
        mf.set_backend(which)
        layer = mf.MaxPool1D(3, 1, 1)
        layer.forward(x)
        got[which] = list(layer._idx)
    mf.set_backend("numpy")
    assert got["python"] == got["numpy"] == [1, 1, 1, 2, 4, 4]


# ---- bad input -------------------------------------------------------------------------------------

def _t(*shape):
    return mf.Tensor.zeros(shape)


@pytest.mark.parametrize("make,x,words", [
    (lambda: mf.Conv1D(3, 4, 3), _t(2, 10, 4), ["Conv1D", "[B,L,3]", "(2, 10, 4)"]),
    (lambda: mf.Conv1D(3, 4, 3), _t(2, 10), ["Conv1D", "[B,L,3]", "(2, 10)"]),
    (lambda: mf.Conv1D(3, 4, 5, padding=1), _t(1, 2, 3), ["Conv1D", "length 2", "padding 1 (4)", "5 positions"]),
    (lambda: mf.Conv1D(3, 4, 3, dilation=3), _t(1, 6, 3), ["Conv1D", "length 6", "dilation 3: 7 positions"]),
    (lambda: mf.MaxPool1D(4), _t(1, 3, 2), ["MaxPool1D", "length 3", "kernel_size 4"]),
    (lambda: mf.AvgPool1D(2), _t(2, 6), ["AvgPool1D", "[B,L,C]", "(2, 6)"]),
    (lambda: mf.LearnedPositionalEmbedding(4, 3), _t(1, 5, 3), ["LearnedPositionalEmbedding", "max_len=4"]),
    (lambda: mf.LearnedPositionalEmbedding(4, 3), _t(1, 2, 5), ["LearnedPositionalEmbedding", "[B,S,3]", "(1, 2, 5)"]),
])
def test_bad_forward_input(make, x, words):
    with pytest.raises(ValueError) as e:
        make().forward(x)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("make,words", [
    (lambda: mf.Conv1D(6, 4, 3, groups=4), ["Conv1D", "groups=4", "in_channels=6", "out_channels=4"]),
    (lambda: mf.Conv1D(4, 6, 3, groups=4), ["Conv1D", "groups=4", "out_channels=6"]),
    (lambda: mf.Conv1D(3, 4, 0), ["Conv1D", "kernel_size", ">= 1", "0"]),
    (lambda: mf.Conv1D(3, 4, 3, stride=0), ["Conv1D", "stride", ">= 1"]),
    (lambda: mf.Conv1D(3, 4, 3, padding=-1), ["Conv1D", "padding", ">= 0", "-1"]),
    (lambda: mf.Conv1D(3, 4, 3.0), ["Conv1D", "kernel_size", "3.0"]),
    (lambda: mf.MaxPool1D(3, padding=2), ["MaxPool1D", "at most kernel_size // 2 = 1", "got 2"]),
    (lambda: mf.AvgPool1D(2, stride=0), ["AvgPool1D", "stride", ">= 1"]),
    (lambda: mf.LearnedPositionalEmbedding(0, 3), ["LearnedPositionalEmbedding", "max_len", "0"]),
])
def test_bad_arguments(make, words):
    with pytest.raises(ValueError) as e:
        make()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_backward():
    for layer, x in ((mf.Conv1D(2, 3, 3), _t(1, 5, 2)), (mf.MaxPool1D(2), _t(1, 4, 2)),
                     (mf.AvgPool1D(2), _t(1, 4, 2)), (mf.LearnedPositionalEmbedding(5, 2), _t(1, 4, 2))):
        name = type(layer).__name__
        with pytest.raises(RuntimeError, match=name + ": backward.. called before forward"):
            layer.backward(_t(1, 4, 2))
        y = layer.forward(x)
        with pytest.raises(ValueError) as e:
            layer.backward(_t(1, 9, 9))
        assert name in str(e.value) and repr(y.shape) in str(e.value) and "(1, 9, 9)" in str(e.value)


def test_bad_state_dict():
    layer = mf.Conv1D(4, 6, 3, groups=2)
    with pytest.raises(ValueError, match=r"'weight' has shape \[6, 4, 3\], expected \[6, 2, 3\]"):
        layer.load_state_dict({"weight": np.zeros((6, 4, 3)), "bias": np.zeros(6)})


# ---- spec: the new layers round-trip -------------------------------------------------------------

def test_spec_round_trip():
    model = mf.Sequential([mf.Reshape((12, 2)), mf.Conv1D(2, 4, 3, stride=2, padding=1, dilation=1, groups=2),
                           mf.MaxPool1D(2, 1, 1), mf.AvgPool1D(3, 2, 1), mf.LearnedPositionalEmbedding(8, 4),
                           mf.Conv1D(4, 4, 1, use_bias=False)])
    spec = mf.to_spec(model)
    again = mf.from_spec(spec)
    assert mf.to_spec(again) == spec
    assert [type(l).__name__ for l in again.layers] == [type(l).__name__ for l in model.layers]
    conv = again.layers[1]
    assert (conv.stride, conv.padding, conv.groups, conv.W.shape) == (2, 1, 2, (4, 1, 3))
    assert again.layers[5].use_bias is False and again.layers[2].padding == 1


# ---- seeded init: the same bits on CPython and both MicroPython ports ----------------------------

INIT_SCRIPT = r'''
from binascii import hexlify
import microformer as mf
mf.seed(5)
layers = [mf.Conv1D(6, 16, 5), mf.Conv1D(4, 8, 3, groups=4), mf.Conv1D(3, 2, 7, use_bias=False),
          mf.LearnedPositionalEmbedding(25, 16)]
print(hexlify(b"".join(bytes(p.data) for l in layers for p, g in l.params())).decode())
'''


def _init_expected():
    """The math: bound b = 1/sqrt(fan_in) rounded down to 24 significant bits (torch's Conv1d
    default; 1/32 for the learned positions), w = fl32(b * u), u = (k - 2^23) / 2^23 from
    xorshift32's top 24 bits, drawn in parameter order from seed 5."""
    from fractions import Fraction
    state = [5]

    def unit():
        x = state[0]
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        state[0] = x
        return ((x >> 8) - 8388608) / 8388608

    def bound(f):
        b = np.float32(1.0 / np.sqrt(f))
        while Fraction(float(b)) ** 2 > Fraction(1, f):
            b = np.nextafter(b, np.float32(0))
        while Fraction(float(np.nextafter(b, np.float32(2)))) ** 2 <= Fraction(1, f):
            b = np.nextafter(b, np.float32(2))
        return float(b)

    out = []
    for n_w, n_b, f in ((16 * 6 * 5, 16, 30), (8 * 1 * 3, 8, 3), (2 * 3 * 7, 0, 21), (25 * 16, 0, None)):
        b = 1.0 / 32 if f is None else bound(f)
        out += [np.float32(b * unit()) for _ in range(n_w + n_b)]
    return np.asarray(out, dtype=np.float32).tobytes().hex()


def test_seeded_init_same_bits_everywhere(tmp_path, micropython):
    f = tmp_path / "init.py"
    f.write_text(INIT_SCRIPT)
    want = _init_expected()
    import subprocess
    import sys
    cp = subprocess.run([sys.executable, str(f)], env=dict(os.environ, PYTHONPATH=helpers.LIB),
                        capture_output=True, text=True, check=True).stdout.strip()
    assert cp == want, "CPython init differs from the math"
    got = helpers.run_micropython(str(f), exe=micropython).strip()
    assert got == want, "%s init differs from the math" % os.path.basename(micropython)


# ---- inside MicroPython: bad input names the layer; a frozen Conv1D has no grad buffers ---------

MP_EXTRA = r'''
import microformer as mf
from array import array
def t(*shape):
    return mf.Tensor.zeros(shape)
for make, x in ((lambda: mf.Conv1D(3, 4, 3), t(2, 10, 4)), (lambda: mf.Conv1D(3, 4, 5, padding=1), t(1, 2, 3)),
                (lambda: mf.MaxPool1D(4), t(1, 3, 2)), (lambda: mf.AvgPool1D(2), t(2, 6)),
                (lambda: mf.LearnedPositionalEmbedding(4, 3), t(1, 5, 3)), (lambda: mf.Conv1D(6, 4, 3, groups=4), None)):
    try:
        make().forward(x)
        print("NO ERROR")
    except ValueError as e:
        print("ERR", e)
for backend in ("python", "viper"):
    mf.set_backend(backend)
    x = t(2, 9, 4)
    for i in range(len(x.data)):
        x.data[i] = ((i * 37) % 23) / 11.0 - 1.0
    out = []
    for frozen in (False, True):
        mf.seed(2)
        c = mf.Conv1D(4, 6, 3, stride=2, padding=1, groups=2)
        c.trainable = not frozen
        y = c.forward(x)
        dx = c.backward(y)
        out.append((list(dx.data), c.dW.data, c.db.data))
    same = out[0][0] == out[1][0]
    # trained: non-zero grads; frozen: no grad buffers
    print("FROZEN", backend, same, max(abs(v) for v in out[0][1]) > 0, out[1][1] is None and out[1][2] is None)
'''


def test_micropython_bad_input_and_frozen(tmp_path, micropython):
    f = tmp_path / "extra.py"
    f.write_text(MP_EXTRA)
    lines = helpers.run_micropython(str(f), exe=micropython).splitlines()
    errs = [l for l in lines if l.startswith(("ERR", "NO ERROR"))]
    assert len(errs) == 6 and all(l.startswith("ERR") for l in errs), errs
    for line, words in zip(errs, (["Conv1D", "[B,L,3]", "(2, 10, 4)"], ["Conv1D", "length 2", "5 positions"],
                                  ["MaxPool1D", "kernel_size 4"], ["AvgPool1D", "[B,L,C]", "(2, 6)"],
                                  ["LearnedPositionalEmbedding", "max_len=4"], ["Conv1D", "groups=4", "in_channels=6"])):
        assert all(w in line for w in words), (line, words)
    assert [l for l in lines if l.startswith("FROZEN")] == ["FROZEN python True True True", "FROZEN viper True True True"]
