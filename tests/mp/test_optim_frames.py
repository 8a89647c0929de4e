"""The optimizer step allocates nothing on the viper backend, not even the interpreter's call
frames: a bytecode function whose frame (arguments, locals, value stack and try blocks) exceeds
11 machine words gets it from the GC heap on every call, which slows as garbage builds up
(micropython.mem_total counts every allocation, freed or not). Checked on each MicroPython port
for Adam, AdamW with decay, SGD with and without momentum, and clipping off."""
import helpers

SCRIPT = r'''
import gc
import micropython
import microformer as mf
from microformer.models import iris_model
mf.set_backend("viper")
model = iris_model(1)
x = mf.Tensor((16, 4))
for i in range(64):
    x.data[i] = (i % 7) / 7.0 - 0.5
lf = mf.CrossEntropyLoss()
lf.forward(model.forward(x), [i % 3 for i in range(16)])
model.backward(lf.backward())
opts = (("adam", mf.Adam(model, lr=1e-3)), ("adamw", mf.Adam(model, lr=1e-3, weight_decay=0.01, decoupled=True)),
        ("sgd_momentum", mf.SGD(model, lr=1e-2, momentum=0.9)), ("sgd", mf.SGD(model, lr=1e-2)))
before = after = 0
for name, opt in opts:
    opt.step()
    opt.step()
    gc.collect()
    before = micropython.mem_total()
    for _ in range(20):
        opt.step()
    after = micropython.mem_total()
    print("ALLOC", name, after - before, opt.steps)
'''


def test_optimizer_step_allocates_nothing(micropython, tmp_path):
    s = tmp_path / "frames.py"
    s.write_text(SCRIPT)
    out = helpers.run_micropython(s, exe=micropython)
    rows = [line.split() for line in out.splitlines() if line.startswith("ALLOC ")]
    assert [r[1] for r in rows] == ["adam", "adamw", "sgd_momentum", "sgd"], out
    for _, name, nbytes, steps in rows:
        assert steps == "22", (name, steps)        # the steps ran (none was refused)
        assert nbytes == "0", "%s: opt.step() allocated %s bytes in 20 steps (a heap frame?)" % (name, nbytes)
