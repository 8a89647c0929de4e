# Freezing a part of a composite layer: runs under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/freeze_mp.py
# prints one line per case and raises AssertionError on the first failure (tests/mp/test_freeze.py
# runs it on every interpreter).
#
# For each case a seeded model is built twice: once as is (the reference) and once with some
# parts frozen. Checked: the frozen parameters are not collected and every other one is; after
# forward + backward the frozen parameters have no grad buffer, every other grad equals the reference's
# and the input gradient equals the reference's; no `trainable` flag changed; an Adam step
# leaves the frozen weights as they were.
import microformer as mf

ATOL = 1e-6


def block_model():
    mf.seed(5)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)),
                          mf.EncoderBlock(8, 2, 12, activation="relu"),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def ffn_model():
    mf.seed(6)
    return mf.Sequential([mf.Dense(4, 6), mf.FeedForward(6, 10, "relu"), mf.Dense(6, 3)])


def nested_model():
    mf.seed(7)
    return mf.Sequential([mf.Dense(4, 6), mf.Sequential([mf.Dense(6, 6), mf.ActivationLayer("tanh")]),
                          mf.Dense(6, 3)])


# name, model factory, what to freeze (paths of attributes / indices from the model)
CASES = [
    ("block.ffn", block_model, [(2, "ffn")]),
    ("block.attn", block_model, [(2, "attn")]),
    ("block.ffn.fc1", block_model, [(2, "ffn", "fc1")]),
    ("block.ln1 + block.ffn.fc2", block_model, [(2, "ln1"), (2, "ffn", "fc2")]),
    ("block (whole)", block_model, [(2,)]),
    ("ffn.fc1", ffn_model, [(1, "fc1")]),
    ("ffn (whole)", ffn_model, [(1,)]),
    ("nested Sequential", nested_model, [(1,)]),
    ("nested Sequential part", nested_model, [(1, 0)]),
]


def _get(model, path):
    obj = model
    for step in path:
        obj = obj[step] if isinstance(step, int) else getattr(obj, step)
    return obj


def _layers(layer, out):
    out.append(layer)
    for sub in layer.sublayers():
        _layers(sub, out)
    return out


def _batch():
    rng = mf.Rng(9)
    x = mf.Tensor((5, 4))
    for i in range(x.size):
        x.data[i] = rng.uniform(-1.0, 1.0)
    return x, [0, 1, 2, 1, 0]


def _step(model):
    for _, g in model.params():
        d = g.data
        if d is None:                      # frozen: no grad buffer
            continue
        for i in range(len(d)):
            d[i] = 0.0
    x, labels = _batch()
    loss = mf.CrossEntropyLoss()
    loss.forward(model.forward(x), labels)
    dx = model.backward(loss.backward())
    return list(dx.data)


def _max_diff(a, b):
    assert len(a) == len(b), "lengths differ: %d vs %d" % (len(a), len(b))
    m = 0.0
    for i in range(len(a)):
        d = abs(a[i] - b[i])
        if d > m:
            m = d
    return m


def check(name, make, paths):
    ref = make()
    ref_dx = _step(ref)
    ref_grads = [list(g.data) for _, g in ref.params()]

    model = make()
    frozen = []
    for path in paths:
        part = _get(model, path)
        part.trainable = False
        for p, _ in part.params():
            frozen.append(p)
    flags = [l.trainable for l in _layers(model, [])]
    assert frozen, "%s: the frozen part has no parameters" % name

    # collected: exactly the parameters outside the frozen parts, in params() order
    want = [p for p, _ in model.params() if not _in(p, frozen)]
    got = [p for p, _ in model.parameters()]
    assert len(got) == len(want) and all(got[i] is want[i] for i in range(len(want))), \
        "%s: collected %s, expected %s" % (name, [p.name for p in got], [p.name for p in want])

    dx = _step(model)
    assert _max_diff(dx, ref_dx) <= ATOL, "%s: the input gradient changed by freezing" % name
    pairs = model.params()
    assert len(pairs) == len(ref_grads)
    n_frozen = n_live = 0
    for i in range(len(pairs)):
        p, g = pairs[i]
        if _in(p, frozen):
            n_frozen += 1
            assert g.data is None, "%s: frozen %s still has a grad buffer" % (name, p.name)
        else:
            n_live += 1
            assert _max_diff(g.data, ref_grads[i]) <= ATOL, "%s: grad of %s differs" % (name, p.name)
    assert [l.trainable for l in _layers(model, [])] == flags, "%s: backward changed a flag" % name

    before = [bytes(p.data) for p in frozen]
    live_before = [bytes(q.data) for q in want]
    opt = mf.Adam(model, lr=1e-2)
    opt.step()
    assert [bytes(p.data) for p in frozen] == before, "%s: the optimizer moved a frozen weight" % name
    if want:
        assert [bytes(q.data) for q in want] != live_before, "%s: nothing trained" % name
    print("freeze %-28s ok: %d frozen, %d trained" % (name, n_frozen, n_live))
    return n_frozen, n_live


def _in(p, seq):
    for q in seq:
        if q is p:
            return True
    return False


def main():
    out = {}
    for name, make, paths in CASES:
        out[name] = check(name, make, paths)
    print("FREEZE OK %d" % len(out))
    return out


main()
