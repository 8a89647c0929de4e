# EncoderBlock.checkpoint inside MicroPython and under CPython, directly
#   MICROPYPATH=lib:tests/mp:tests micropython tests/mp/block_checkpoint_mp.py [BACKEND]
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
from block_cases import model as _model, own_forward_floats as _own_fwd, run as _run

if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])          # else the interpreter's default (viper, numpy)

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
