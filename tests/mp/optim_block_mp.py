# The optimizer's one-block state and its all-or-nothing step without shadow copies: the
# exponent bound (kernels.max_exponent) against the float32 bits; a step whose values the bound
# covers runs each group's kernel once, one it cannot cover (a huge finite gradient) runs a dry
# run first and still takes the step; grouping the tensors differently gives the same bits.
# Runs under CPython and MicroPython:  micropython tests/mp/optim_block_mp.py BACKEND OUT.json
import json
import struct
import sys
from array import array

import microformer as mf
from microformer import backend, optim
from microformer.train import train_step


def field(x):
    # the exponent field of x as float32, from its bits (the oracle)
    return (struct.unpack("<I", struct.pack("<f", x))[0] >> 23) & 0xFF


class Counting:
    """Every kernel of `real`, its calls counted by name."""

    def __init__(self, real):
        self.n = {}
        for name in dir(real):
            f = getattr(real, name)
            if not name.startswith("_") and callable(f) and not isinstance(f, type):
                setattr(self, name, self._wrap(name, f))

    def _wrap(self, name, f):
        def call(*args):
            self.n[name] = self.n.get(name, 0) + 1
            return f(*args)
        return call


def model(seed=1):
    mf.seed(seed)
    layers = [mf.Dense(4, 40)]
    for _ in range(3):
        layers += [mf.ActivationLayer("relu"), mf.Dense(40, 40)]
    return mf.Sequential(layers + [mf.ActivationLayer("relu"), mf.Dense(40, 3)])   # 5,243 parameters


def batch():
    r = mf.Rng(5)
    X = mf.Tensor.from_list([[r.uniform(-2, 2) for _ in range(4)] for _ in range(8)])
    return X, [r.randint(3) for _ in range(8)]


def state(m, opt):
    return [bytes(p.data) for _, p in m.named_params()] + [bytes(b) for b in opt.state_blocks()]


def steps(make, group, n=3):
    old = optim.GROUP
    optim.GROUP = group
    try:
        m = model()
        opt = make(m)
    finally:
        optim.GROUP = old
    X, y = batch()
    for _ in range(n):
        train_step(m, mf.CrossEntropyLoss(), opt, X, y)
    return state(m, opt), opt


def run(name):
    mf.set_backend(name)
    K = backend.K
    r = {"backend": name}
    vals = [0.0, 1e-45, 1e-40, 1.0, -2.5, 3.0e38, -1e-3, 0.75, 65504.0]
    buf = array("f", vals)
    r["fields"] = [K.max_exponent(buf, k) for k in range(len(vals) + 1)]
    r["oracle"] = [max([0] + [field(x) for x in vals[:k]]) for k in range(len(vals) + 1)]
    r["nonfinite"] = [K.max_exponent(array("f", [1.0, x, 2.0]), 3) for x in (float("nan"), float("inf"), -float("inf"))]

    pw = mf.Tensor.from_list([[0.5, -3.0], [1e-40, 2.0]])
    pg = mf.Tensor.from_list([[7e20, 0.0], [1.0, -1.0]])
    qw = mf.Tensor.from_list([1e30, 0.0])
    qg = mf.Tensor.from_list([0.25, -0.125])
    pairs = [(pw, pg), (qw, qg)]
    r["pairs"] = [K.max_exponent_pairs(pairs, 0), K.max_exponent_pairs(pairs, 1)]
    r["pairs_oracle"] = [max([field(x) for x in list(pw.data) + list(qw.data)]),
                         max([field(x) for x in list(pg.data) + list(qg.data)])]
    pg.data[3] = float("nan")
    r["pairs_nan"] = K.max_exponent_pairs(pairs, 1)

    # grouping: one group per tensor, the default groups, one group of all: the same bits
    for tag, make in (("adam", lambda m: mf.Adam(m, lr=0.01)),
                      ("adamw", lambda m: mf.Adam(m, lr=0.01, weight_decay=0.1, decoupled=True)),
                      ("sgd", lambda m: mf.SGD(m, lr=0.05, momentum=0.9, weight_decay=0.01))):
        runs = [steps(make, g) for g in (500, optim.GROUP, 10 ** 6)]
        r["groups_" + tag] = [o._groups for _, o in runs]
        r["same_" + tag] = runs[0][0] == runs[1][0] == runs[2][0]

    # kernel calls of a covered step and of one the bound cannot cover
    m = model()
    opt = mf.Adam(m, lr=0.01)
    X, y = batch()
    lf = mf.CrossEntropyLoss()
    train_step(m, lf, opt, X, y)
    counter = Counting(K)
    backend.K = counter
    try:
        train_step(m, lf, opt, X, y)
    finally:
        backend.K = K
    r["groups"] = opt._groups
    r["calls_covered"] = counter.n.get("adam_step", 0)
    opt.zero_grad()
    lf.forward(m.forward(X), y)
    m.backward(lf.backward())
    opt.params[0][1].data[0] = 5e18     # above the bound (2^59), its square (2^124) still finite
    counter = Counting(K)
    backend.K = counter
    try:
        opt.step()
        r["huge_step"] = "taken"
    except Exception as e:
        r["huge_step"] = "%s: %s" % (type(e).__name__, e)
    finally:
        backend.K = K
    r["calls_huge"] = counter.n.get("adam_step", 0)
    r["steps"] = opt.steps
    r["finite"] = all(K.first_nonfinite(p.data, p.size) < 0 for _, p in m.named_params())
    # memory: two state blocks of numel floats and a scratch of 3 groups' stretch
    r["numel"] = opt.numel
    r["blocks"] = [len(b) for b in opt.state_blocks()]
    r["scratch"] = [len(b) for b in opt._scratch]
    r["stretch"] = optim.scratch_stretch([p.size for _, p in m.named_params()])
    r["largest"] = max([p.size for _, p in m.named_params()])
    big_pieces(r)
    return r


def big_model():
    mf.seed(4)
    return mf.Sequential([mf.Dense(100, 50), mf.ActivationLayer("relu"), mf.Dense(50, 3)])   # 5,000 + 203


def big_pieces(r):
    # a tensor larger than GROUP is updated in pieces: the scratch stays GROUP floats per slot,
    # the bits are those of one group of everything, and a piece's non-finite result names its
    # tensor and leaves every weight and moment as it was
    X = mf.Tensor.from_list([[((i * 7 + j) % 11) / 5.0 - 1.0 for j in range(100)] for i in range(4)])
    y = [0, 1, 2, 1]
    out = []
    for group in (optim.GROUP, 10 ** 6):
        old = optim.GROUP
        optim.GROUP = group
        try:
            m = big_model()
            opt = mf.Adam(m, lr=0.01)
        finally:
            optim.GROUP = old
        for _ in range(2):
            train_step(m, mf.CrossEntropyLoss(), opt, X, y)
        out.append((state(m, opt), opt))
    r["big_same"] = out[0][0] == out[1][0]
    opt = out[0][1]
    r["big_scratch"] = [len(b) for b in opt._scratch]
    r["big_largest"] = max([p.size for p, _ in opt.params])
    m = big_model()
    opt = mf.Adam(m, lr=0.01)
    train_step(m, mf.CrossEntropyLoss(), opt, X, y)
    opt.zero_grad()
    lf = mf.CrossEntropyLoss()
    lf.forward(m.forward(X), y)
    m.backward(lf.backward())
    w = opt.params[0][0]
    for k in range(4096, 5000):           # the weight's last piece: near the float32 limit,
        w.data[k] = 3e38 if k & 1 else -3e38    # and a step of lr 3e38 takes some beyond it
    opt.lr = 3e38
    before = state(m, opt)
    try:
        opt.step()
        r["big_refused"] = "taken"
    except Exception as e:
        r["big_refused"] = "%s: %s" % (type(e).__name__, e)
    r["big_unchanged"] = state(m, opt) == before and opt.steps == 1


if __name__ == "__main__":
    res = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(res))
