"""Golden vectors from tests/oracles/reference.py: a fixed small attention case with every intermediate, a
DecoderBlock case and a Conv1D case (forward and every gradient).

    python tests/oracles/golden_vectors.py [DIR]        (default tests/golden): writes attention.mfg, decoder.mfg, conv1d.mfg

File format "MFGV" version 1 (all little-endian; the board reads it with readinto, see
lib/microformer/golden.py):

    offset 0   4 bytes   magic b"MFGV"
           4   u16       version = 1
           6   u16       N, the number of records
    then N records, one after the other:
               u8        L, then L bytes: the record name (ASCII)
               u8        R (rank), then R x u16: the shape
               4 * prod(shape) bytes: float32 values, row-major

Records, in this order (B=2 S=4 E=8 H=2, causal, item 1's last key padded):
    config [6]            B, S, E, H, causal (1/0), use_bias (1/0)
    mask [B,S]            1.0 = padded key
    x [B,S,E]             the input
    Wq bq Wk bk Wv bv Wo bo    weights [E,E] and biases [E] (torch.nn.Linear layout)
    Q K V [B,S,E]         projections
    scores_raw [B,H,S,S]      Q_h K_h^T, before scaling
    scores_scaled [B,H,S,S]   / sqrt(D), D = E / H
    scores_masked [B,H,S,S]   -inf where the key is hidden (future or padded)
    weights [B,H,S,S]         softmax; exactly 0 where hidden, rows sum to 1
    ctx [B,S,E]           heads concatenated;  y [B,S,E] = ctx Wo^T + bo
    dy [B,S,E]            an upstream gradient; then dx [B,S,E] and dWq dbq dWk dbk dWv dbv dWo dbo
Values are computed in float64 from float32-rounded inputs, then stored as float32.

decoder.mfg (B=2 S=4 Sk=3 E=8 H=2 hidden 12, GELU; target and memory padding):
    config [7]            B, S, Sk, E, H, hidden, use_bias (1/0)
    tgt_mask [B,S] memory_mask [B,Sk]    1.0 = padded
    x [B,S,E] memory [B,Sk,E]
    the parameters by microformer.DecoderBlock's names (ln1.gamma .. ffn.b2, DECODER_PARAMS order)
    y [B,S,E]; dy [B,S,E]; dx [B,S,E]; dmemory [B,Sk,E]; d<name> for every parameter

conv1d.mfg (channels-last, B=2 L=9 Cin=4 Cout=6 k=3 stride=2 padding=2 dilation=2 groups=2):
    config [10]           B, L, Cin, Cout, k, stride, padding, dilation, groups, use_bias (1/0)
    x [B,L,Cin]; W [Cout,Cin/groups,k]; b [Cout]; y [B,Lout,Cout]; dy; dx; dW; db
"""
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference as ref  # noqa: E402

MAGIC = b"MFGV"
VERSION = 1
DEFAULT_DIR = os.path.join(os.path.dirname(HERE), "golden")
DEFAULT_PATH = os.path.join(DEFAULT_DIR, "attention.mfg")
ATTN = ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo")
DECODER_PARAMS = (("ln1.gamma", "ln1.beta") + tuple("self_attn." + n for n in ATTN) + ("ln2.gamma", "ln2.beta")
                  + tuple("cross_attn." + n for n in ATTN) + ("ln3.gamma", "ln3.beta", "ffn.W1", "ffn.b1",
                                                               "ffn.W2", "ffn.b2"))


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def attention_case(seed=2024, B=2, S=4, E=8, H=2, causal=True, mask=((0, 0, 0, 0), (0, 0, 0, 1))):
    """The records (name, float64 array) of the golden attention case, in file order."""
    rng = np.random.default_rng(seed)
    mask = np.asarray(mask, dtype=np.float64)
    x = f32(rng.normal(size=(B, S, E)))
    p = {}
    for n in ATTN:
        p[n] = f32(rng.normal(scale=0.5, size=(E, E))) if n[0] == "W" else f32(rng.normal(scale=0.2, size=E))
    dy = f32(rng.normal(size=(B, S, E)))
    y, c = ref.attention_forward(x, p, H, causal=causal, key_padding_mask=mask.astype(bool))
    dx, g, _ = ref.attention_backward(dy, c, p)
    rec = [("config", np.array([B, S, E, H, 1 if causal else 0, 1], dtype=np.float64)), ("mask", mask), ("x", x)]
    rec += [(n, p[n]) for n in ATTN]
    rec += [("Q", c["Q"]), ("K", c["K"]), ("V", c["V"]),
            ("scores_raw", c["scores_raw"]), ("scores_scaled", c["scores_scaled"]),
            ("scores_masked", c["scores_masked"]), ("weights", c["A"]), ("ctx", c["ctx"]), ("y", y),
            ("dy", dy), ("dx", dx)]
    rec += [("d" + n, g["d" + n]) for n in ATTN]
    return rec


def decoder_case(seed=2025, B=2, S=4, Sk=3, E=8, H=2, F=12, tgt_len=(4, 3), mem_len=(3, 2)):
    """The records of the golden DecoderBlock case (pre-norm, causal self-attention, GELU)."""
    rng = np.random.default_rng(seed)
    tmask = (np.arange(S)[None, :] >= np.asarray(tgt_len)[:, None]).astype(np.float64)
    mmask = (np.arange(Sk)[None, :] >= np.asarray(mem_len)[:, None]).astype(np.float64)
    x = f32(rng.normal(size=(B, S, E)))
    memory = f32(rng.normal(size=(B, Sk, E)))
    shapes = {"ffn.W1": (F, E), "ffn.b1": (F,), "ffn.W2": (E, F), "ffn.b2": (E,)}
    p = {}
    for n in DECODER_PARAMS:
        last = n.split(".")[-1]
        if last == "gamma":
            p[n] = f32(1.0 + rng.normal(scale=0.1, size=E))
        elif n in shapes:
            p[n] = f32(rng.normal(scale=0.4 if n[-2] == "W" else 0.1, size=shapes[n]))
        else:
            p[n] = f32(rng.normal(scale=0.4 if last[0] == "W" else 0.1, size=(E, E) if last[0] == "W" else E))
    dy = f32(rng.normal(size=(B, S, E)))
    y, c = ref.decoder_block_forward(x, memory, p, H, tmask.astype(bool), mmask.astype(bool), "gelu")
    dx, dmem, g = ref.decoder_block_backward(dy, c, p)
    rec = [("config", np.array([B, S, Sk, E, H, F, 1], dtype=np.float64)), ("tgt_mask", tmask),
           ("memory_mask", mmask), ("x", x), ("memory", memory)]
    rec += [(n, p[n]) for n in DECODER_PARAMS]
    rec += [("y", y), ("dy", dy), ("dx", dx), ("dmemory", dmem)]
    rec += [("d" + n, g["d" + n]) for n in DECODER_PARAMS]
    return rec


def conv1d_case(seed=2026, B=2, L=9, Cin=4, Cout=6, k=3, stride=2, padding=2, dilation=2, groups=2):
    """The records of the golden Conv1D case (channels-last, every option away from its default)."""
    rng = np.random.default_rng(seed)
    x = f32(rng.normal(size=(B, L, Cin)))
    W = f32(rng.normal(scale=0.5, size=(Cout, Cin // groups, k)))
    b = f32(rng.normal(scale=0.2, size=Cout))
    y, c = ref.conv1d_forward(x, W, b, stride, padding, dilation, groups)
    dy = f32(rng.normal(size=y.shape))
    dx, dW, db = ref.conv1d_backward(dy, c)
    cfg = np.array([B, L, Cin, Cout, k, stride, padding, dilation, groups, 1], dtype=np.float64)
    return [("config", cfg), ("x", x), ("W", W), ("b", b), ("y", y), ("dy", dy), ("dx", dx), ("dW", dW),
            ("db", db)]


CASES = (("attention.mfg", attention_case), ("decoder.mfg", decoder_case), ("conv1d.mfg", conv1d_case))


def write(path, records):
    out = bytearray(MAGIC + struct.pack("<HH", VERSION, len(records)))
    for name, a in records:
        a = np.asarray(a)
        nb = name.encode("ascii")
        out += struct.pack("<B", len(nb)) + nb + struct.pack("<B", a.ndim)
        out += struct.pack("<%dH" % a.ndim, *a.shape)
        out += a.astype("<f4").tobytes()
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "wb") as f:
        f.write(bytes(out))
    return len(out)


def read(path):
    """[(name, float32 array)] in file order (the NumPy twin of microformer.golden.read)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != MAGIC:
        raise ValueError("%s: not a golden-vector file (magic %r)" % (path, data[:4]))
    version, n = struct.unpack_from("<HH", data, 4)
    if version != VERSION:
        raise ValueError("%s: golden version %d, expected %d" % (path, version, VERSION))
    off = 8
    out = []
    for _ in range(n):
        L = data[off]
        name = data[off + 1:off + 1 + L].decode("ascii")
        off += 1 + L
        R = data[off]
        shape = struct.unpack_from("<%dH" % R, data, off + 1)
        off += 1 + 2 * R
        size = int(np.prod(shape))
        out.append((name, np.frombuffer(data, "<f4", size, off).reshape(shape)))
        off += 4 * size
    if off != len(data):
        raise ValueError("%s: %d trailing bytes" % (path, len(data) - off))
    return out


def stale(path, fresh, maxulp=1, zero=1e-12):
    """What differs between the golden file at `path` and the records a writer would write now
    (`fresh`): [] when they agree. Names, order and shapes must be the same and every value within
    `maxulp` float32 units in the last place: the float64 math rounds to float32 once, and the
    order in which the machine's BLAS sums a product can move a value that lies next to a float32
    rounding boundary across it (seen: one value of 5,000 on another CPU); a stale file differs
    by far more. Values within `zero` of each other both below it in size are round-off of an
    exact zero (the gradient of a key bias is zero: softmax ignores a shift along a row) and agree."""
    old = read(path)
    problems = []
    if [(n, a.shape) for n, a in old] != [(n, np.asarray(a).shape) for n, a in fresh]:
        return ["records differ: file %s, now %s" % ([(n, a.shape) for n, a in old],
                                                     [(n, np.asarray(a).shape) for n, a in fresh])]
    for (name, a), (_, b) in zip(old, fresh):
        b = np.asarray(b).astype("<f4")
        if a.tobytes() == b.tobytes():
            continue
        # float32 bit patterns as ordered integers: their difference counts the floats between
        ia, ib = (x.view("<i4").astype(np.int64) for x in (a, b))
        ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
        ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
        apart = np.abs(ia - ib)
        apart[(np.abs(a) < zero) & (np.abs(b) < zero)] = 0
        far = int(apart.max())
        if far > maxulp:
            problems.append("%s: %d ulp apart" % (name, far))
    return problems


def main(argv):
    d = argv[1] if len(argv) > 1 else DEFAULT_DIR
    if os.path.exists(d) and not os.path.isdir(d):
        raise SystemExit("golden.py: %s is not a directory (expected a directory for %s)"
                         % (d, ", ".join(n for n, _ in CASES)))
    for name, case in CASES:
        path = os.path.join(d, name)
        n = write(path, case())
        print("wrote %s (%d bytes)" % (path, n))


if __name__ == "__main__":
    main(sys.argv)
