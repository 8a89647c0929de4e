# EncoderBlock.checkpoint inside MicroPython and under CPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/block_checkpoint_mp.py [BACKEND]
# raises AssertionError on the first failure, then prints BLOCK CHECKPOINT OK n (backend).
#
# Two pre-norm blocks (LoRA on every linear, and full training), two steps each: with checkpoint
# on, the output, the input gradient and every parameter gradient are bit for bit those of the
# same model without it, on the backend's own kernels (viper: the same block-float kernels run
# again on the same inputs); the parts inside the blocks then keep no forward arrays of their own;
# on MicroPython's viper backend a steady checkpointed step allocates no more than one without it.
import sys

import microformer as mf
from microformer import layer as L

if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])          # else the interpreter's default (viper, numpy)


def _model(lora, ck):
    mf.seed(5)
    m = mf.Sequential([mf.EncoderBlock(16, 2, 32), mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(),
                       mf.Dense(16, 3)])
    if lora:
        mf.add_lora(m, rank=2, alpha=4)
    for b in m.layers[:2]:
        b.checkpoint = ck
    return m


def _run(m):
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


def _own_fwd(layer):
    n = 0
    for s in layer.sublayers() if hasattr(layer, "sublayers") else ():
        n += _own_fwd(s)
    for name in ("lora", "lora_q", "lora_k", "lora_v", "lora_o"):
        a = getattr(layer, name, None)
        if a is not None:
            n += _own_fwd(a)
    st = getattr(layer, "_stages", None) or {}
    if "_fwd" in st:
        n += sum(len(a) for a in st["_fwd"][0])
    return n


n = 0
for lora in (True, False):
    kept = []
    res = []
    for ck in (False, True):
        L.scratch.free()
        m = _model(lora, ck)
        res.append(_run(m))
        kept.append(sum(_own_fwd(p) for b in m.layers[:2] for p in b.sublayers()))
    assert res[0] == res[1], "lora=%s: checkpoint changed the results" % lora
    assert kept[0] > 0 and kept[1] == 0, kept
    print("case lora=%s: bit-identical, parts' own forward floats %d -> %d" % (lora, kept[0], kept[1]))
    n += 1
if sys.implementation.name == "micropython" and mf.get_backend() == "viper":
    # (the portable kernels box a float per element: they allocate by design)
    # steady state: a checkpointed step (the forward run again included) allocates no more than
    # the same step without it (its buffers placed once, found again at the same offsets)
    import gc
    got = []
    for ck in (False, True):
        L.scratch.free()
        m = _model(True, ck)
        _run(m)
        x = mf.Tensor.zeros((3, 5, 16))
        dy = mf.Tensor.zeros((3, 3))
        m.forward(x)
        m.backward(dy)
        gc.collect()
        gc.disable()
        a = gc.mem_alloc()
        m.forward(x)
        m.backward(dy)
        got.append(gc.mem_alloc() - a)
        gc.enable()
    assert got[1] <= got[0], got
    print("case steady step: bytes allocated %d without, %d with checkpoint" % (got[0], got[1]))
    n += 1
print("BLOCK CHECKPOINT OK %d (%s)" % (n, mf.get_backend()))
