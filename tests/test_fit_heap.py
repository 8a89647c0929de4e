"""Heap the user feels, inside MicroPython (both interpreters, viper backend):

- the real fit loop (train.fit on Iris: 120 rows, batch 16, so each epoch ends with a batch of 8)
  allocates < 1 KB per step over whole epochs, the partial batch and the epoch boundary included;
- a smaller batch after a larger one runs on views of the larger one's buffers and gives the same
  outputs and gradients, bit for bit, as a model that only ever saw the smaller batch;
- greedy decoding through the KV cache (the decode stack of board/bench.py) allocates < 1 KB per
  token.
"""
import re

import helpers

FIT = r'''
import gc
import sys
sys.path.insert(0, "board")
import microformer as mf
from microformer import train as T
import iris
mf.set_backend("viper")
tr, te, _, _ = iris.load_split("datasets/iris.csv")
assert len(tr) == 120
model = iris.build_model(1)
opt = mf.Adam(model, lr=1e-3)
lf = mf.CrossEntropyLoss()
T.fit(model, lf, opt, tr, epochs=2, batch_size=16, verbose=False)
gc.collect()
gc.disable()
a0 = gc.mem_alloc()
s0 = opt.steps
hist = T.fit(model, lf, opt, tr, epochs=3, batch_size=16, verbose=False)
d = gc.mem_alloc() - a0
gc.enable()
print("FIT", opt.steps - s0, d)
'''

VIEWS = r'''
import microformer as mf
from microformer.tensor import Rng
mf.set_backend("viper")

def build():
    mf.seed(7)
    return mf.Sequential([mf.Dense(4, 16), mf.ActivationLayer("gelu"), mf.Reshape((2, 8)),
                          mf.EncoderBlock(8, 2, 16), mf.GlobalAvgPool(), mf.Dense(8, 3)])

def batch(B, seed):
    r = Rng(seed)
    x = mf.Tensor((B, 4))
    for i in range(B * 4):
        x.data[i] = r.uniform(-1.0, 1.0)
    return x, [i % 3 for i in range(B)]

def run(model, x, y):
    lf = mf.CrossEntropyLoss()
    for _, g in model.parameters():
        mf.backend.K.zero(g.data, g.size)
    out = model.forward(x)
    lf.forward(out, y)
    model.backward(lf.backward())
    return bytes(out.data) + b"".join(bytes(g.data) for _, g in model.parameters())

a = build()
x16, y16 = batch(16, 1)
x8, y8 = batch(8, 2)
run(a, x16, y16)
got = run(a, x8, y8)                 # views on the 16-row buffers
b = build()
want = run(b, x8, y8)                # its own 8-row buffers
print("VIEWS", got == want, len(got))
again = run(a, x16, y16)
print("BACK", again == run(build(), x16, y16))
'''


MECH = r'''
from microformer.layer import Buffered
from microformer.tensor import Tensor

class L(Buffered):
    def _allocate(self, stage, shape, other):
        B = shape[0]
        self.a = Tensor.zeros((B, 3))
        self.b = Tensor.zeros((B, 2, 2))
        self.c = Tensor.zeros((5,))

l = L()
l._buffers("s", (6, 3))
big = (l.a, l.b, l.c)
for t in big:
    for i in range(t.size):
        t.data[i] = 7.0
l._buffers("s", (2, 3))
small = (l.a, l.b, l.c)
ok = [l.a.shape == (2, 3), l.b.shape == (2, 2, 2), l.c.shape == (5,)]
ok.append(all(t.data[i] == 0.0 for t in small for i in range(t.size)))     # zeros, as promised
for k in range(3):                   # each a view on the start of its own big array
    small[k].data[0] = 100.0 + k
ok.append([big[k].data[0] for k in range(3)] == [100.0, 101.0, 102.0])
ok.append(big[0].data[1] == 0.0 and big[1].data[1] == 0.0 and big[0].data[6] == 7.0)
l._buffers("s", (6, 3))
ok.append(l.a is big[0] and l.b is big[1] and l.c is big[2])                  # the same objects back
l._buffers("s", (9, 3))              # larger: new arrays, the old keys dropped
ok.append(l.a.size == 27 and l.a is not big[0])
l._buffers("s", (2, 3))
ok.append(l.a.data[0] == 0.0 and l.a.shape == (2, 3))
print("MECH", ok)
'''


def _figures(out, tag):
    m = re.search(r"^%s (\d+) (\d+)$" % tag, out, re.M)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_fit_loop_heap_per_step(micropython, tmp_path):
    f = tmp_path / "fit_heap.py"
    f.write_text(FIT)
    steps, allocated = _figures(helpers.run_micropython(str(f), heap="8M", exe=micropython), "FIT")
    assert steps == 24                   # 3 epochs of 8 steps (7 of 16 rows, 1 of 8)
    assert allocated / steps < 1024, "fit loop: %.0f B per step (%d steps)" % (allocated / steps, steps)


def test_smaller_batch_on_views_is_exact(micropython, tmp_path):
    f = tmp_path / "views.py"
    f.write_text(VIEWS)
    out = helpers.run_micropython(str(f), heap="8M", exe=micropython)
    assert re.search(r"^VIEWS True \d+$", out, re.M), out
    assert "BACK True" in out, out


def test_views_are_distinct_prefixes_of_the_largest(micropython, tmp_path):
    f = tmp_path / "mech.py"
    f.write_text(MECH)
    out = helpers.run_micropython(str(f), heap="1M", exe=micropython)
    m = re.search(r"^MECH (.*)$", out, re.M)
    assert m and m.group(1) == repr([True] * 9), out


def test_decode_heap_per_token(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/bench.py", "decode", "viper", "gelu", "1",
                                  heap="8M", exe=micropython)
    m = re.search(r"^DECODE viper gelu (\S+) (\S+) ", out, re.M)
    assert m, out
    per_token = float(m.group(2))
    assert 0 <= per_token < 1024, "decode: %.0f B per token" % per_token
