# Gradient buffers appear on the first backward and go when a part is frozen: a model built for
# inference holds none (its heap is its weights, not weights and grads); freezing drops them;
# unfreezing and training makes them again.
# Runs under CPython and MicroPython:  micropython tests/mp/grads_lazy_mp.py BACKEND OUT.json
import gc
import json
import sys

import microformer as mf
from microformer.layer import grad_floats
from microformer.train import train_step

MP = sys.implementation.name == "micropython"


def build():
    # a gesture model: Conv1D over 3 channels, an encoder block, mean pool, 5 classes
    mf.seed(3)
    return mf.Sequential([mf.Conv1D(3, 16, 5), mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(), mf.Dense(16, 5)])


def batch():
    r = mf.Rng(4)
    x = mf.Tensor.from_list([[[r.uniform(-1, 1) for _ in range(3)] for _ in range(20)] for _ in range(4)])
    return x, [r.randint(5) for _ in range(4)]


def run(name):
    mf.set_backend(name)
    r = {"backend": name}
    x, y = batch()
    build()                                  # the layers' code and tables loaded once
    gc.collect()
    a0 = gc.mem_alloc() if MP else 0
    m = build()
    gc.collect()
    r["built_heap"] = (gc.mem_alloc() - a0) if MP else -1
    # the heap that using every grad takes (each makes its buffer): nothing if they were there
    other = build()
    gc.collect()
    a0 = gc.mem_alloc() if MP else 0
    for _, g in other.params():
        g.data
    gc.collect()
    r["use_heap"] = (gc.mem_alloc() - a0) if MP else -1
    del other
    r["floats"] = sum([p.size for _, p in m.params()])
    r["built"] = grad_floats(m)
    m.forward(x)
    r["after_forward"] = grad_floats(m)
    lf = mf.CrossEntropyLoss()
    lf.forward(m.forward(x), y)
    m.backward(lf.backward())
    r["after_backward"] = grad_floats(m)
    head = sum([p.size for p, _ in m.layers[3].params()])
    for layer in m.layers[:3]:
        layer.trainable = False
    r["frozen"] = grad_floats(m)
    r["head"] = head
    for layer in m.layers[:3]:
        layer.trainable = True
    r["unfrozen"] = grad_floats(m)
    opt = mf.Adam(m, lr=0.01)
    r["trainable"] = opt.numel
    train_step(m, lf, opt, x, y)
    r["after_fit"] = grad_floats(m)
    r["steps"] = opt.steps
    return r


if __name__ == "__main__":
    res = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(res))
