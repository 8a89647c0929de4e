# LoRA adapters and partial backward inside MicroPython (and CPython, for the reference):
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/lora_mp.py python|viper
# prints one JSON line per case ("CASE {...}": seeded layers with LoRA adapters, their forward
# output, input gradient and adapter gradients), then runs checks that hold on any backend and
# raises AssertionError on the first failure:
#  - merge() gives the unmerged outputs (within the backend's GEMM rounding: printed, and checked
#    by tests/mp/test_lora_micropython.py);
#  - a frozen prefix: the trainable grads are bit for bit those of the full backward, the
#    frozen layers have no grad buffer;
#  - a LoRA fine-tune of a few Adam steps lowers the loss and leaves every base weight as it was.
import json
import sys

import microformer as mf
from microformer import lora as L
from microformer.loss import CrossEntropyLoss

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "python"
mf.set_backend(BACKEND)


def rand(shape, seed, scale=1.0):
    r = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = scale * r.uniform(-1.0, 1.0)
    return t


def fill(t, seed, scale=1.0):
    r = mf.Rng(seed)
    for i in range(t.size):
        t.data[i] = scale * r.uniform(-1.0, 1.0)


def out(case, values):
    print("CASE " + json.dumps({"case": case, "values": values}))


def flat(t):
    return [float(v) for v in t.data]


def dense_case():
    mf.seed(3)
    d = mf.Dense(12, 5)
    fill(d.b, 1)
    (_, a), = L.add_lora(d, rank=3, alpha=6, targets="dense")
    fill(a.B, 2, 0.5)
    x = rand((4, 12), 4)
    dy = rand((4, 5), 5)
    y = d.forward(x)
    dx = d.backward(dy)
    out("dense", {"y": flat(y), "dx": flat(dx), "dA": flat(a.dA), "dB": flat(a.dB),
                  "x": flat(x), "dy": flat(dy), "W": flat(d.W), "b": flat(d.b), "A": flat(a.A),
                  "B": flat(a.B), "s": a.scaling, "N": 4, "C": 12, "OC": 5, "r": 3})


def attention_case(cross):
    mf.seed(4)
    E = 8
    att = mf.Attention(E, 2)
    for n in "qkvo":
        fill(getattr(att, "b" + n), ord(n))
    found = L.add_lora(att, rank=2, alpha=4, targets="attention")
    for i in range(len(found)):
        fill(found[i][1].B, 10 + i, 0.5)
    x = rand((2, 3, E), 20)
    c = rand((2, 4, E), 21) if cross else None
    y = att.forward(x, context=c)
    v = {"y": flat(y), "dx": flat(att.backward(rand((2, 3, E), 22)))}
    if cross:
        v["dcontext"] = flat(att.dcontext)
    for n, a in found:
        v[n + ".dA"] = flat(a.dA)
        v[n + ".dB"] = flat(a.dB)
    out("attention_cross" if cross else "attention", v)


def block_model(seed=6):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)), mf.EncoderBlock(8, 2, 12, activation="relu"),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def block_case():
    m = block_model()
    found = L.add_lora(m, rank=2, alpha=4, targets=("attention", "ffn"))
    for i in range(len(found)):
        fill(found[i][1].B, 30 + i, 0.3)
    x = rand((3, 4), 40)
    lf = CrossEntropyLoss()
    v = {"loss": lf.forward(m.forward(x), [0, 1, 2])}
    m.backward(lf.backward())
    for n, a in found:
        v[n + ".dA"] = flat(a.dA)
        v[n + ".dB"] = flat(a.dB)
    y = flat(m.forward(x))
    mf.merge_lora(m)
    out("block", v)
    out("merge", {"unmerged": y, "merged": flat(m.forward(x))})


def partial_check():
    x = rand((5, 4), 9)
    labels = [0, 1, 2, 1, 0]
    lf = CrossEntropyLoss()
    ref = block_model()
    lf.forward(ref.forward(x), labels)
    ref.backward(lf.backward())
    m = block_model()
    m.layers[0].trainable = False
    m.layers[2].attn.trainable = False
    lf.forward(m.forward(x), labels)
    assert m.backward(lf.backward()) is None, "a frozen prefix: no input gradient"
    rp = ref.params()
    mp = m.params()
    live = 0
    for i in range(len(mp)):
        g = mp[i][1]
        if g.data is None:
            continue
        live += 1
        assert bytes(g.data) == bytes(rp[i][1].data), "grad of %s differs from the full backward" % mp[i][0].name
    frozen = [g for _, g in m.layers[0].params()] + [g for _, g in m.layers[2].attn.params()]
    for g in frozen:
        assert g.data is None, "frozen %s has a grad buffer" % g.name
    assert live == len(m.parameters()) and live == len(mp) - len(frozen)
    print("partial ok: %d grads bit-identical, %d frozen without buffers" % (live, len(frozen)))


def finetune_check():
    m = block_model(7)
    mf.add_lora(m, rank=4, alpha=8, targets=("attention", "ffn"))
    m.layers[-1].trainable = True
    base = [bytes(p.data) for p, g in m.params() if g.data is None]
    x = rand((8, 4), 11)
    labels = [0, 1, 2, 0, 1, 2, 0, 1]
    opt = mf.Adam(m, lr=3e-2)
    lf = CrossEntropyLoss()
    losses = []
    for _ in range(10):
        opt.zero_grad()
        losses.append(lf.forward(m.forward(x), labels))
        m.backward(lf.backward())
        opt.step()
    assert losses[-1] < 0.8 * losses[0], "LoRA fine-tune did not lower the loss: %r" % losses
    assert [bytes(p.data) for p, g in m.params() if g.data is None] == base, "a base weight moved"
    print("finetune ok: loss %.4f -> %.4f, %d base tensors unchanged, %d trainable params"
          % (losses[0], losses[-1], len(base), L.trainable_count(m)))


def alloc_check():
    # a steady-state step (forward, backward) allocates nothing: a Dense and an Attention with
    # adapters, and a Sequential whose backward stops at its head
    import gc
    mf.seed(13)
    d = mf.Dense(6, 4)
    L.add_lora(d, targets="dense")
    att = mf.Attention(8, 2)
    L.add_lora(att, targets="attention")
    head = block_model(8)
    for l in head.layers[:-1]:
        l.trainable = False
    cases = [("dense", d, rand((3, 6), 1), rand((3, 4), 2)),
             ("attention", att, rand((2, 3, 8), 3), rand((2, 3, 8), 4)),
             ("head only", head, rand((3, 4), 5), rand((3, 3), 6))]
    for name, layer, x, dy in cases:
        for _ in range(2):
            layer.forward(x)
            layer.backward(dy)
        gc.collect()
        gc.disable()
        try:
            a0 = gc.mem_alloc()
            layer.forward(x)
            layer.backward(dy)
            a = gc.mem_alloc() - a0
        finally:
            gc.enable()
        assert a == 0, "%s: a steady-state forward + backward allocated %d bytes" % (name, a)
        print("alloc %s ok" % name)


dense_case()
attention_case(False)
attention_case(True)
block_case()
partial_check()
finetune_check()
if sys.implementation.name == "micropython" and BACKEND == "viper":
    alloc_check()
print("LORA OK " + BACKEND)
