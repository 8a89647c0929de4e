# microformer.golden: read golden-vector files ("MFGV", written by tests/oracles/golden_vectors.py) with readinto,
# and check the Attention layer against them stage by stage, the DecoderBlock and Conv1D layers
# forward and backward (board selftest, tests, REPL).
# Format (little-endian): b"MFGV", u16 version=1, u16 N; N records of
#   u8 L + name, u8 R + R x u16 shape, float32 data. Record order: see tests/oracles/golden_vectors.py.
import struct

from . import backend
from .tensor import Tensor

MAGIC = b"MFGV"
VERSION = 1
_INF = float("inf")


def read(path):
    """[(name, Tensor)] in file order; each tensor's floats land in its buffer via readinto."""
    out = []
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8 or head[:4] != MAGIC:
            raise ValueError("golden: %s is not a golden-vector file (magic %r, expected %r)"
                             % (path, head[:4], MAGIC))
        version, n = struct.unpack("<HH", head[4:])
        if version != VERSION:
            raise ValueError("golden: %s has version %d, expected %d" % (path, version, VERSION))
        for _ in range(n):
            L = f.read(1)[0]
            name = f.read(L).decode()
            R = f.read(1)[0]
            shape = struct.unpack("<%dH" % R, f.read(2 * R))
            t = Tensor(shape, name=name)
            got = f.readinto(t.data)
            if got != 4 * t.size:
                raise ValueError("golden: %s is truncated in record %r" % (path, name))
            out.append((name, t))
    return out


def _err(got, want):
    """max |got - want| / max(1, max |want|); -inf must match -inf exactly (else inf).
    (The golden values are O(1); a record that is 0 in exact math, like dbk, is judged absolutely.)"""
    scale = 1.0
    for w in want:
        if w != -_INF and abs(w) > scale:
            scale = abs(w)
    e = 0.0
    for i in range(len(want)):
        w = want[i]
        g = got[i]
        if w == -_INF or g == -_INF:
            if w != g:
                return _INF
            continue
        d = abs(g - w)
        if d > e:
            e = d
    return e / scale


def invariants(weights, mask, B, H, S, causal, tol=1e-5):
    """Problems with softmax weights [B,H,S,S] (flat): rows sum to 1 (or are all 0 when every key
    is hidden), future keys (causal) and padded keys weigh exactly 0. Returns a list of strings."""
    bad = []
    for b in range(B):
        for h in range(H):
            for i in range(S):
                base = ((b * H + h) * S + i) * S
                total = 0.0
                visible = 0
                for j in range(S):
                    w = weights[base + j]
                    hidden = (causal and j > i) or mask[b * S + j] != 0.0
                    if hidden:
                        if w != 0.0:
                            bad.append("b%d h%d query %d: hidden key %d weighs %r, not 0" % (b, h, i, j, w))
                    else:
                        visible += 1
                    total += w
                want = 1.0 if visible else 0.0
                if abs(total - want) > tol:
                    bad.append("b%d h%d query %d: weights sum to %r, not %r" % (b, h, i, total, want))
    return bad


def check_attention(path, backend_name=None):
    """Run lib's Attention on the golden case; returns (errors {record: relative error},
    invariant problems). Compares Q K V, the three score stages, weights, ctx, y, dx and grads.
    Expect errors <= 1e-4 on the 'python' backend, <= 5e-3 on 'viper'."""
    from .attention import Attention
    if backend_name:
        backend.set_backend(backend_name)
    rec = dict(read(path))
    cfg = rec["config"].data
    B, S, E, H, causal, use_bias = [int(v) for v in cfg]
    attn = Attention(E, H, use_bias=bool(use_bias), causal=bool(causal))
    for p, _ in attn.params():
        p.data[:] = rec[p.name].data
    m = rec["mask"].data
    mask = bytearray(B * S)
    for i in range(B * S):
        mask[i] = 1 if m[i] else 0
    y = attn.forward(rec["x"], key_padding_mask=mask)
    st = attn.stages()
    errors = {"y": _err(y.data, rec["y"].data)}
    for name in ("Q", "K", "V", "scores_raw", "scores_scaled", "scores_masked", "weights", "ctx"):
        errors[name] = _err(st[name].data, rec[name].data)
    dx = attn.backward(rec["dy"])
    errors["dx"] = _err(dx.data, rec["dx"].data)
    for p, g in attn.params():
        errors["d" + p.name] = _err(g.data, rec["d" + p.name].data)
    # the viper kernels compute in block floating point: their rows sum to 1 within ~1e-4 (native:
    # float32, as the portable loops)
    tol = 1e-5 if backend.get_backend() in ("python", "native") else 2e-3
    problems = invariants(st["weights"].data, m, B, H, S, causal, tol)
    return errors, problems


def _mask(t):
    m = bytearray(t.size)
    for i in range(t.size):
        m[i] = 1 if t.data[i] else 0
    return m


def _load(layer, rec, path):
    for p, _ in layer.params():
        if p.name not in rec:
            raise ValueError("golden: %s has no record %r for the layer's parameter" % (path, p.name))
        w = rec[p.name]
        if w.size != p.size:
            raise ValueError("golden: %s record %r has %d values, the layer's parameter %d"
                             % (path, p.name, w.size, p.size))
        p.data[:] = w.data


def _grads(layer, rec, errors):
    for p, g in layer.params():
        errors["d" + p.name] = _err(g.data, rec["d" + p.name].data)


def check_decoder(path, backend_name=None):
    """Run lib's DecoderBlock on the golden case (decoder.mfg); returns {record: relative error}
    for y, dx, dmemory and every parameter gradient (tolerances as check_attention)."""
    from .decoder import DecoderBlock
    if backend_name:
        backend.set_backend(backend_name)
    rec = dict(read(path))
    B, S, Sk, E, H, F, use_bias = [int(v) for v in rec["config"].data]
    blk = DecoderBlock(E, H, F, use_bias=bool(use_bias))
    _load(blk, rec, path)
    y = blk.forward(rec["x"], rec["memory"], _mask(rec["tgt_mask"]), _mask(rec["memory_mask"]))
    errors = {"y": _err(y.data, rec["y"].data)}
    dx = blk.backward(rec["dy"])
    dmem = blk.dmemory
    errors["dx"] = _err(dx.data, rec["dx"].data)
    errors["dmemory"] = _err(dmem.data, rec["dmemory"].data)
    _grads(blk, rec, errors)
    return errors


def check_conv1d(path, backend_name=None):
    """Run lib's Conv1D on the golden case (conv1d.mfg); returns {record: relative error} for y,
    dx, dW and db."""
    from .conv import Conv1D
    if backend_name:
        backend.set_backend(backend_name)
    rec = dict(read(path))
    B, L, Cin, Cout, k, stride, padding, dilation, groups, use_bias = [int(v) for v in rec["config"].data]
    conv = Conv1D(Cin, Cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups,
                  use_bias=bool(use_bias))
    _load(conv, rec, path)
    y = conv.forward(rec["x"])
    errors = {"y": _err(y.data, rec["y"].data)}
    dx = conv.backward(rec["dy"])
    errors["dx"] = _err(dx.data, rec["dx"].data)
    _grads(conv, rec, errors)
    return errors
