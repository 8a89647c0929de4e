# int8 frozen weights inside MicroPython (and CPython, for comparison):
#   MICROPYPATH=lib:tests micropython tests/mp/int8_mp.py python|viper [CHECKPOINT_PATH]
# prints one JSON line per case ("CASE {...}": int8 layers, their inputs, their int8 rows and row
# scales, outputs and gradients); tests/mp/test_int8.py recomputes each from the math with NumPy.
# It asserts itself, raising AssertionError on the first failure:
#  - add_lora then quant.int8 and quant.int8 then add_lora give the same layer (bit for bit);
#  - a checkpoint of an int8 model reloads bit for bit (int8 rows, scales, every output), and the
#    file is left at CHECKPOINT_PATH for the test to read on CPython.
import json
import sys

import microformer as mf
from microformer import lora as L
from microformer import quant

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "python"
CKPT = sys.argv[2] if len(sys.argv) > 2 else None
mf.set_backend(BACKEND)


def fill(t, seed, scale=1.0):
    r = mf.Rng(seed)
    for i in range(t.size):
        t.data[i] = scale * r.uniform(-1.0, 1.0)
    return t


def rand(shape, seed, scale=1.0):
    return fill(mf.Tensor(shape), seed, scale)


def flat(a):
    return [float(v) for v in (a.data if hasattr(a, "data") else a)]


def ints(a):
    return [int(v) for v in a]


def out(case, values):
    print("CASE " + json.dumps({"case": case, "values": values}))


def dense_case():
    mf.seed(5)
    d = mf.Dense(37, 9)
    fill(d.b, 1, 0.5)
    d.trainable = False
    quant.int8(d, show=False)
    x = rand((5, 37), 2)
    dy = rand((5, 9), 3)
    y = d.forward(x)
    dx = d.backward(dy, need_dx=True)
    out("dense", {"x": flat(x), "dy": flat(dy), "q": ints(d.W.q), "scale": flat(d.W.scale),
                  "b": flat(d.b), "y": flat(y), "dx": flat(dx), "N": 5, "C": 37, "OC": 9})


def attention_case():
    mf.seed(6)
    a = mf.Attention(8, 2)
    for i, n in enumerate("qkvo"):
        fill(getattr(a, "b" + n), 10 + i, 0.3)
    a.trainable = False
    quant.int8(a, show=False)
    x = rand((2, 3, 8), 7)
    dy = rand((2, 3, 8), 8)
    y = a.forward(x)
    dx = a.backward(dy)
    v = {"x": flat(x), "dy": flat(dy), "y": flat(y), "dx": flat(dx)}
    for n in "qkvo":
        W = getattr(a, "W" + n)
        v["q" + n] = ints(W.q)
        v["s" + n] = flat(W.scale)
        v["b" + n] = flat(getattr(a, "b" + n))
    out("attention", v)


def lora_case():
    # a LoRA adapter on an int8 base: forward, backward, one SGD step of the adapter
    def build(order):
        mf.seed(3)
        d = mf.Dense(12, 5)
        fill(d.b, 1)
        if order == "lora first":
            L.add_lora(d, rank=3, alpha=6, targets="dense")
            quant.int8(d, show=False)
        else:
            d.trainable = False
            quant.int8(d, show=False)
            L.add_lora(d, rank=3, alpha=6, targets="dense")
        fill(d.lora.B, 2, 0.5)
        return d
    d = build("lora first")
    e = build("int8 first")
    for a, b in ((d.W.q, e.W.q), (d.W.scale, e.W.scale), (d.lora.A.data, e.lora.A.data),
                 (d.lora.B.data, e.lora.B.data)):
        assert bytes(a) == bytes(b), "add_lora / quant.int8 in either order: the same layer"
    a = d.lora
    x = rand((4, 12), 4)
    dy = rand((4, 5), 5)
    A0 = flat(a.A)
    B0 = flat(a.B)
    opt = mf.SGD(d.parameters(), lr=0.1)
    assert len(d.parameters()) == 2, "only the adapter trains (the bias is frozen by add_lora)"
    opt.zero_grad()
    y = d.forward(x)
    dx = d.backward(dy)
    dA = flat(a.dA)
    dB = flat(a.dB)
    opt.step()
    out("lora", {"x": flat(x), "dy": flat(dy), "q": ints(d.W.q), "scale": flat(d.W.scale),
                 "b": flat(d.b), "A": A0, "B": B0, "s": a.scaling, "y": flat(y), "dx": flat(dx),
                 "dA": dA, "dB": dB, "A1": flat(a.A), "B1": flat(a.B), "lr": 0.1,
                 "N": 4, "C": 12, "OC": 5, "r": 3})


def worst_case():
    # the largest operands the kernels can see: every input at the top of its block, q = 127
    # and -128, scale with a full mantissa; products all of one sign ([B6] in the viper GEMM)
    K = backend_k = mf.backend.K
    big = 1.9999998807907104                    # 2 - 2^-23: a full 24-bit mantissa
    from array import array
    res = {}
    for n in (1, 9, 64, 257, 1000, 4096):
        x = array("f", [big] * n)
        q = array("b", [127] * n + [-128] * n)
        sc = array("f", [big, big])
        y = array("f", [0.0, 0.0])
        backend_k.q8_matmul_forward(y, x, q, sc, None, 1, n, 2)
        dout = array("f", [-big] * n)            # dinp (1, 2) = dout (1, n) . W (n, 2)
        qt = array("b", [-128, 127] * n)
        sct = array("f", [big] * n)
        dinp = array("f", [1.0, 1.0])
        backend_k.q8_matmul_backward_input(dinp, dout, qt, sct, 1, 2, n, 1)
        res[str(n)] = [y[0], y[1], dinp[0], dinp[1]]
    assert K is backend_k
    out("worst", {"big": [big], "cases": [[int(k)] + v for k, v in res.items()]})


def checkpoint_case(path):
    mf.seed(9)
    m = mf.Sequential([mf.Dense(6, 16), mf.ActivationLayer("relu"), mf.Reshape((2, 8)),
                       mf.EncoderBlock(8, 2, 16), mf.GlobalAvgPool(), mf.Dense(8, 3)])
    m.trainable = False
    m[-1].trainable = True
    quant.int8(m, show=False)
    x = rand((3, 6), 11)
    y = flat(m.forward(x))
    mf.save_checkpoint(path, m)
    m2 = mf.load_model(path)
    assert quant.is_int8(m2)
    n8 = 0
    for (n1, p1), (n2, p2) in zip(m.named_params(), m2.named_params()):
        assert n1 == n2
        if quant.is_int8(p1):
            assert quant.is_int8(p2) and bytes(p1.q) == bytes(p2.q) and bytes(p1.scale) == bytes(p2.scale), n1
            n8 += 1
        else:
            assert bytes(p1.data) == bytes(p2.data), n1
    assert flat(m2.forward(x)) == y, "the reloaded model computes the same outputs bit for bit"
    q = {}
    for n, p in m.named_params():
        if quant.is_int8(p):
            q[n] = [ints(p.q), flat(p.scale)]
    out("checkpoint", {"n8": [n8], "q": q})


dense_case()
attention_case()
lora_case()
worst_case()
if CKPT:
    checkpoint_case(CKPT)
print("INT8 OK " + BACKEND)
