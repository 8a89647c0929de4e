"""int8 frozen weights (microformer.quant).

Against NumPy written from the math (w = q * scale, never calling lib): tests/mp/int8_mp.py's cases
(an int8 Dense, an int8 Attention through tests/oracles/reference.py, a LoRA adapter on an int8 base
with one SGD step, the worst-case operands of the viper kernels) on CPython (portable and NumPy
backends) and inside both MicroPython ports (portable and viper): portable and NumPy within 1e-5;
viper within the GEMM bound of README "Tolerances" (2^-11 K max|a| max|w|, plus 2^-11 of an
addend), which the worst-case operands drive to its limits (an overflow of the 32-bit
accumulators would be off by far more). The checkpoint a MicroPython port writes reloads bit for
bit there (the script asserts it) and tests/oracles/checkpoint_np.py reads the same int8 rows and scales.
Refusals: a trainable weight, a part matching nothing, a non-finite weight, merge_lora onto an int8
base, a float32 tensor from a file for a weight held as int8, a version-1 reader given a version-2
file.
"""
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import helpers

sys.path.insert(0, helpers.ORACLES)
import checkpoint_np  # noqa: E402
import reference as R  # noqa: E402

import microformer as mf  # noqa: E402
from microformer import quant  # noqa: E402

SCRIPT = helpers.script("int8_mp.py")
U = 2.0 ** -11


def _cases(stdout):
    out = {}
    for line in stdout.splitlines():
        if line.startswith("CASE "):
            c = json.loads(line[5:])
            out[c["case"]] = c["values"]
    return out


def _w(q, scale, OC, C):
    return np.asarray(q, np.float64).reshape(OC, C) * np.asarray(scale, np.float64)[:, None]


def _err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))


def _check(cases, viper):
    # every case against NumPy from the math; viper within its documented bounds
    d = cases["dense"]
    N, C, OC = d["N"], d["C"], d["OC"]
    W = _w(d["q"], d["scale"], OC, C)
    x = np.asarray(d["x"]).reshape(N, C)
    dy = np.asarray(d["dy"]).reshape(N, OC)
    y = x @ W.T + np.asarray(d["b"])
    dx = dy @ W
    if viper:
        ty = U * (C * np.abs(x).max(axis=1)[:, None] * np.abs(W).max(axis=1)[None, :] + np.abs(d["b"])) + 1e-6
        tdx = U * OC * np.abs(dy).max(axis=1)[:, None] * np.abs(W).max() + 1e-6
        assert np.all(np.abs(np.asarray(d["y"]).reshape(N, OC) - y) <= ty)
        assert np.all(np.abs(np.asarray(d["dx"]).reshape(N, C) - dx) <= tdx)
    else:
        assert _err(d["y"], y.ravel()) <= 1e-5
        assert _err(d["dx"], dx.ravel()) <= 1e-5

    a = cases["attention"]
    p = {}
    for n in "qkvo":
        p["W" + n] = _w(a["q" + n], a["s" + n], 8, 8)
        p["b" + n] = np.asarray(a["b" + n])
    x = np.asarray(a["x"]).reshape(2, 3, 8)
    y, cache = R.attention_forward(x, p, 2)
    dx, _, _ = R.attention_backward(np.asarray(a["dy"]).reshape(2, 3, 8), cache, p)
    tol = 2e-3 if viper else 1e-5       # viper's attention path: test_viper_range.py pins its bounds
    assert _err(a["y"], y.ravel()) <= tol
    assert _err(a["dx"], dx.ravel()) <= tol

    c = cases["lora"]
    N, C, OC, r, s = c["N"], c["C"], c["OC"], c["r"], c["s"]
    W = _w(c["q"], c["scale"], OC, C)
    x = np.asarray(c["x"]).reshape(N, C)
    dy = np.asarray(c["dy"]).reshape(N, OC)
    A = np.asarray(c["A"]).reshape(r, C)
    B = np.asarray(c["B"]).reshape(OC, r)
    y = x @ W.T + np.asarray(c["b"]) + s * (x @ A.T) @ B.T
    dB = s * dy.T @ (x @ A.T)
    dA = s * (dy @ B).T @ x
    dx = dy @ W + s * (dy @ B) @ A
    want = {"y": y, "dx": dx, "dA": dA, "dB": dB, "A1": A - c["lr"] * dA, "B1": B - c["lr"] * dB}
    for k, v in want.items():
        assert _err(c[k], v.ravel()) <= (2e-3 if viper else 1e-5), k

    for row in cases["worst"]["cases"]:
        K, y0, y1, d0, d1 = row
        big = cases["worst"]["big"][0]
        wy = (K * big * 127 * big, -K * big * 128 * big)
        wd = (1.0 + K * big * 128 * big, 1.0 - K * big * 127 * big)     # old dinp 1.0 + dout . W
        if viper:
            ty = U * K * big * 128 * big + 1e-6 * K
            td = U * K * big * (big * 128) + U * 1.0 + 1e-6 * K
        else:                                                            # float32 sums of K terms
            ty = td = 2.0 ** -23 * K * K * big * 128 * big
        assert abs(y0 - wy[0]) <= ty and abs(y1 - wy[1]) <= ty, (K, y0, y1, wy)
        assert abs(d0 - wd[0]) <= td and abs(d1 - wd[1]) <= td, (K, d0, d1, wd)


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_int8_inside_micropython(micropython, backend, tmp_path):
    path = tmp_path / "int8.mfck"
    out = helpers.run_micropython(SCRIPT, backend, path, heap="8M", exe=micropython)
    assert "INT8 OK " + backend in out
    cases = _cases(out)
    _check(cases, backend == "viper")
    # the file MicroPython wrote: the same int8 rows and scales under an independent reader
    _, _, tensors = checkpoint_np.read_int8(str(path))
    q = cases["checkpoint"]["q"]
    assert len(q) == cases["checkpoint"]["n8"][0] == 7
    for name, (qq, sc) in q.items():
        fq, fs = tensors[name]
        assert fq.ravel().tolist() == qq
        assert np.array_equal(fs, np.asarray(sc, np.float32)), name


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_int8_cpython(backend, tmp_path):
    out = helpers.run_cpython(SCRIPT, backend, tmp_path / "int8.mfck")
    assert "INT8 OK " + backend in out
    _check(_cases(out), False)


# ---- in-process (CPython) ------------------------------------------------------------------

def _model(E=8, H=2):
    mf.seed(1)
    return mf.Sequential([mf.Dense(6, 2 * E), mf.Reshape((2, E)), mf.EncoderBlock(E, H, 2 * E),
                          mf.GlobalAvgPool(), mf.Dense(E, 3)])


def test_quantize_is_symmetric_per_row():
    t = mf.Tensor.from_list([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 2.9, -0.01]])
    w = quant.quantize(t)
    a = np.asarray(t.tolist(), np.float32)
    scale = (np.abs(a).max(axis=1) / np.float32(127)).astype(np.float32)
    assert np.array_equal(np.frombuffer(w.scale, np.float32), scale)
    q = np.zeros_like(a)
    q[scale > 0] = np.round(a[scale > 0] / scale[scale > 0, None])
    assert np.array_equal(np.frombuffer(w.q, np.int8).reshape(3, 3), q.astype(np.int8))
    assert np.abs(np.frombuffer(w.q, np.int8)).max() == 127


def test_int8_converts_frozen_weights_and_reports_bytes(capsys):
    m = _model(64, 4)
    m.trainable = False
    m[-1].trainable = True                         # the head trains: left float32, and said so
    before = quant.weight_bytes(m)
    rep = quant.int8(m)
    text = capsys.readouterr().out
    assert "trainable, kept float32: 4.weight" in text
    names = [r[0] for r in rep]
    assert names == ["0.weight", "2.self_attn.in_proj_weight[q]", "2.self_attn.in_proj_weight[k]",
                     "2.self_attn.in_proj_weight[v]", "2.self_attn.out_proj.weight", "2.linear1.weight",
                     "2.linear2.weight"]
    for name, b, a in rep:
        assert a < b
    assert not quant.is_int8(m[-1]) and quant.is_int8(m[2]) and quant.is_int8(m)
    # the weight matrices themselves: >= 3.5x smaller at E = 64
    wb = sum(b for _, b, _ in rep)
    wa = sum(a for _, _, a in rep)
    assert wb / wa >= 3.5, (wb, wa)
    assert before - quant.weight_bytes(m) == wb - wa
    assert quant.int8(m, show=False) == []        # nothing left to convert


def test_refusals_leave_the_model_unchanged():
    m = _model()
    with pytest.raises(ValueError, match=r"0\.weight \(Dense\.W\) is trainable"):
        quant.int8(m, ["0.weight"])
    with pytest.raises(ValueError, match=r"'nope\.weight' matches no weight matrix; the model has \['0\.weight'"):
        quant.int8(m, ["nope.weight"])
    m.trainable = False
    m[0].W.data[3] = float("nan")
    with pytest.raises(ValueError, match=r"0\.weight \(Dense\.W\) holds nan at flat index 3"):
        quant.int8(m)
    assert not quant.is_int8(m)
    m[0].W.data[3] = 0.5
    quant.int8(m, ["*.linear1.weight"], show=False)
    assert quant.is_int8(m[2].ffn.fc1) and not quant.is_int8(m[0])


def test_int8_weight_never_trains_and_names_itself():
    m = _model()
    m.trainable = False
    quant.int8(m, show=False)
    m.trainable = True                              # unfreezing: everything but the int8 weights
    assert m[0].dW.data is None and m[0].db.data is not None
    ids = [id(p) for p, _ in m.parameters()]
    assert id(m[0].W) not in ids and id(m[0].b) in ids
    with pytest.raises(TypeError, match=r"weight 'W' is stored as int8.*quant\.dequantize"):
        m[0].W.data
    with pytest.raises(TypeError, match="stored as int8"):
        m[0].load_state_dict({"weight": [[0.0] * 6] * 16, "bias": [0.0] * 16})
    # dequantize: float32 again, q * scale, still frozen
    q = np.frombuffer(m[0].W.q, np.int8).reshape(16, 6) * np.frombuffer(m[0].W.scale, np.float32)[:, None]
    quant.dequantize(m)
    assert not quant.is_int8(m)
    assert np.array_equal(np.asarray(m[0].W.tolist(), np.float32), q.astype(np.float32))
    assert m[0].dW.data is None


def test_merge_lora_refuses_an_int8_base():
    m = _model()
    mf.add_lora(m, rank=2, alpha=4, targets=("attention", "ffn"))
    quant.int8(m, show=False)
    before = bytes(m[2].attn.Wq.q)
    with pytest.raises(ValueError, match=r"merge_lora: the base weight of 2\.self_attn\.q_proj is int8.*dequantize"):
        mf.merge_lora(m)
    assert bytes(m[2].attn.Wq.q) == before and m[2].attn.lora_q is not None
    quant.dequantize(m)
    assert mf.merge_lora(m) == 6


def test_state_dict_gives_dequantized_values():
    m = _model()
    m.trainable = False
    quant.int8(m, show=False)
    sd = m.state_dict()
    a = m[2].attn
    want = np.concatenate([_w(w.q, w.scale, 8, 8) for w in (a.Wq, a.Wk, a.Wv)]).astype(np.float32)
    assert np.array_equal(np.asarray(sd["2.self_attn.in_proj_weight"].tolist(), np.float32), want)
    assert np.array_equal(np.asarray(sd["0.weight"].tolist(), np.float32),
                          _w(m[0].W.q, m[0].W.scale, 16, 6).astype(np.float32))


def test_checkpoint_versions_and_refusals(tmp_path):
    m = _model()
    plain = tmp_path / "plain.mfck"
    mf.save_checkpoint(str(plain), m)
    assert mf.checkpoint.read_header(str(plain))["version"] == 1     # float32 models: still version 1
    m.trainable = False
    quant.int8(m, show=False)
    path = tmp_path / "int8.mfck"
    mf.save_checkpoint(str(path), m)
    h = mf.checkpoint.read_header(str(path))
    assert h["version"] == 2 and len(h["int8"]) == 8
    # a version-1 reader (the module as it was before version 2) refuses it, naming the version
    old = subprocess.run(["git", "show", "e38909f:lib/microformer/checkpoint.py"], cwd=helpers.ROOT,
                         capture_output=True, text=True, check=True).stdout
    (tmp_path / "old_checkpoint.py").write_text(old)
    spec = importlib.util.spec_from_file_location("old_checkpoint", tmp_path / "old_checkpoint.py")
    oldck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oldck)
    with pytest.raises(ValueError, match=r"unsupported version 2 \(this reader knows version 1\)"):
        oldck.read(str(path))
    assert len(oldck.read(str(plain))[1]) == len(m.named_params())
    # read() dequantizes; checkpoint_np agrees
    _, tensors = mf.checkpoint.read(str(path))
    _, _, npt = checkpoint_np.read(str(path))
    for name, shape, a in tensors:
        assert np.array_equal(np.frombuffer(a, np.float32).reshape(shape), npt[name]), name
    # a float32 tensor for a weight the model holds as int8: refused, nothing read
    m2 = _model()
    m2.trainable = False
    quant.int8(m2, show=False)
    q = bytes(m2[0].W.q)
    with pytest.raises(mf.CheckpointError, match=r"tensor '0\.W' is float32 in the file, and the model holds it as int8"):
        mf.load_checkpoint(str(plain), m2)
    assert bytes(m2[0].W.q) == q
    # load into a float32 model: the weights become int8, frozen, bit for bit
    m3 = _model()
    mf.load_checkpoint(str(path), m3)
    for (n1, p1), (n2, p2) in zip(m.named_params(), m3.named_params()):
        if quant.is_int8(p1):
            assert bytes(p1.q) == bytes(p2.q) and bytes(p1.scale) == bytes(p2.scale)
        else:
            assert bytes(p1.data) == bytes(p2.data)
    assert m3[0].dW.data is None


def test_forged_dtype_is_refused(tmp_path):
    m = _model()
    m.trainable = False
    quant.int8(m, show=False)
    path = tmp_path / "int8.mfck"
    mf.save_checkpoint(str(path), m)
    raw = bytearray(path.read_bytes())
    i = raw.index(b"0.W") + 3 + 1 + 8            # name, rank, two dims: the dtype byte
    assert raw[i] == 1
    raw[i] = 7
    import zlib
    raw[-4:] = (zlib.crc32(bytes(raw[:-4])) & 0xFFFFFFFF).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(mf.CheckpointError, match=r"tensor record '0\.W': dtype 7"):
        mf.load_checkpoint(str(path), _model())


def test_session_int8_switch(tmp_path, iris_flash, capsys):
    # s.int8(): the frozen weights become int8, the weight memory is printed, LoRA fine-tunes on
    # top, and a saved checkpoint reopens with its int8 weights
    sys.path.insert(0, helpers.ROOT + "/board")
    import finetune
    root = iris_flash(tmp_path / "a")
    s = finetune.Session(root=root, verbose=True)
    s.lora(rank=4, alpha=8)
    before = quant.weight_bytes(s.model)
    capsys.readouterr()
    names = s.int8()
    out = capsys.readouterr().out
    after = quant.weight_bytes(s.model)
    assert after < before
    assert "int8: %d weight matrices; weight memory %d -> %d bytes" % (len(names), before, after) in out, out
    assert names == ["0.weight", "3.in_proj_weight[q]", "3.in_proj_weight[k]", "3.in_proj_weight[v]",
                     "3.out_proj.weight", "5.weight"], names
    w = bytes(s.model[3].Wq.q)
    s.fit(epochs=2, data="train", verbose=False)
    assert bytes(s.model[3].Wq.q) == w                # the int8 base never changes
    assert s.evaluate(verbose=False)["accuracy"] >= 0.9
    s.save()
    s2 = finetune.Session(root=root, verbose=False)
    assert quant.is_int8(s2.model) and bytes(s2.model[3].Wq.q) == w


def test_torch_export_dequantizes_and_says_so(capsys):
    torch = pytest.importorskip("torch")
    import torch_io
    m = _model()
    m.trainable = False
    quant.int8(m, show=False)
    x = mf.Tensor.from_list([[0.1 * i - 0.2 * j for i in range(6)] for j in range(3)])
    mf.set_backend("python")
    try:
        y = np.asarray(m.eval().forward(x).tolist())
    finally:
        mf.set_backend("numpy")
    module = torch_io.to_torch(m)
    out = capsys.readouterr().out
    assert "to_torch: 8 int8 weights exported dequantized (float32 q * scale): 0.W, 2.attn.Wq" in out, out
    w = module.state_dict()["0.weight"].numpy()
    assert np.array_equal(w, _w(m[0].W.q, m[0].W.scale, 16, 6).astype(np.float32))
    with torch.no_grad():
        ty = module.eval()(torch.tensor(x.tolist())).numpy()
    assert np.max(np.abs(ty - y)) <= 1e-5


def test_int8_attention_decodes_as_its_forward():
    # the KV-cache path (the kept-weight products of decode_step) runs on the int8 weights too
    mf.seed(2)
    a = mf.Attention(8, 2, causal=True, max_len=6)
    a.trainable = False
    quant.int8(a, show=False)
    x = mf.Tensor.from_list([[[0.1 * ((i * 7 + j * 3) % 11) - 0.5 for j in range(8)] for i in range(5)]])
    full = np.asarray(a.forward(x).tolist())[0]
    a.prefill(mf.Tensor.from_list([x.tolist()[0][:2]]))
    for t in range(2, 5):
        y = a.decode_step(mf.Tensor.from_list([[x.tolist()[0][t]]]))
        assert np.max(np.abs(np.asarray(y.tolist())[0, 0] - full[t])) <= 1e-5, t
