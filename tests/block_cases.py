# The EncoderBlock.checkpoint cases, shared by tests/mp/block_checkpoint_mp.py (MicroPython and a
# CPython subprocess) and tests/unit/test_block_checkpoint.py (the suite's CPython): MicroPython-
# portable; the backend is whatever the caller set (mf.set_backend) before calling.
import microformer as mf


def model(lora, ck, norm_first=True, dropout=0.0):
    # two EncoderBlock(16, 2 heads, FFN 32), mean pool, Dense(16, 3); LoRA r=2 on every linear
    mf.seed(5)
    m = mf.Sequential([mf.EncoderBlock(16, 2, 32, norm_first=norm_first, dropout=dropout),
                       mf.EncoderBlock(16, 2, 32, norm_first=norm_first, dropout=dropout),
                       mf.GlobalAvgPool(), mf.Dense(16, 3)])
    if lora:
        mf.add_lora(m, rank=2, alpha=4)
    for b in m.layers[:2]:
        b.checkpoint = ck
    return m


def run(m):
    # two steps (the second on the buffers the first made): outputs, input grads, then the grads
    x = mf.Tensor.zeros((3, 5, 16))
    r = mf.Rng(11)
    for i in range(len(x.data)):
        x.data[i] = r.uniform(-1.0, 1.0)
    dy = mf.Tensor.zeros((3, 3))
    for i in range(len(dy.data)):
        dy.data[i] = (i % 7) * 0.1 - 0.3
    out = []
    for _ in range(2):
        out.append(list(m.forward(x).data))
        out.append(list(m.backward(dy).data))
    for _, g in m.collect_params([]):
        out.append(list(g.data))
    return out


def own_forward_floats(layer):
    # floats of the forward stages a layer and its parts (LoRA adapters included) hold as their own arrays
    n = 0
    for s in layer.sublayers() if hasattr(layer, "sublayers") else ():
        n += own_forward_floats(s)
    for name in ("lora", "lora_q", "lora_k", "lora_v", "lora_o"):
        a = getattr(layer, name, None)
        if a is not None:
            n += own_forward_floats(a)
    st = getattr(layer, "_stages", None) or {}
    if "_fwd" in st:
        n += sum(len(a) for a in st["_fwd"][0])
    return n
