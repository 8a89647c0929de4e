# The trainer (microformer.train.Trainer) on every interpreter: run by tests/mp/test_trainer.py
# under CPython and both MicroPython ports.
#   trainer_mp.py micro [backend]   micro-batches add up to the batch: the weights after two
#                                   steps in micro-batches of 1, 3, 4 and 12 rows against the
#                                   whole batch of 12 (SGD with momentum):
#                                   MICRO <opt> <rows> <max |diff|> <max |w|>
#   trainer_mp.py calls [backend]   matmul_backward_input calls of Iris's fit: CALLS <n> <steps>
#   trainer_mp.py plan MODEL B MICRO   the plan's activations and the heap a fit step leaves
#                                   (MicroPython): PLAN <need> <measured>
#   trainer_mp.py release           a fit that fails gives its memory back: RELEASE <bytes kept>
import gc
import sys

import microformer as mf
from microformer.data import Dataset
from microformer.layer import drop_scratch
from microformer.train import Trainer


def _model(kind="sensor"):
    mf.seed(7)
    if kind == "sensor":        # a Conv1D + EncoderBlock over windows of 10 x 3, 4 classes
        return mf.Sequential([mf.Conv1D(3, 8, 3), mf.EncoderBlock(8, 2, 16), mf.GlobalAvgPool(),
                              mf.Dense(8, 4)]), (10, 3), 4
    if kind == "conv":          # the gesture model of the memory goals: 50 x 3 windows, 5 classes
        return mf.Sequential([mf.Conv1D(3, 16, 5), mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(),
                              mf.Dense(16, 5)]), (50, 3), 5
    E = 32                      # an encoder over 16 tokens of 8 features
    return mf.Sequential([mf.Dense(8, E), mf.EncoderBlock(E, 2, 64), mf.GlobalAvgPool(),
                          mf.Dense(E, 6)]), (16, 8), 6


def _data(shape, C, N, seed=5):
    F = 1
    for d in shape:
        F *= d
    X = mf.Tensor((N, F))
    r = mf.Rng(seed)
    for i in range(N * F):
        X.data[i] = r.signed_unit()
    return Dataset(X, [(i * 7) % C for i in range(N)], [str(c) for c in range(C)],
                   ["f%d" % i for i in range(F)])


def micro(opts):
    for opt in opts:
        runs = {}
        for rows in (12, 1, 3, 4, 5):
            model, shape, C = _model()
            o = mf.SGD(model, lr=0.05, momentum=0.9) if opt == "sgd" else mf.Adam(model, lr=0.01)
            t = Trainer(model, mf.CrossEntropyLoss(), o, batch_size=12, micro_batch=rows, input_shape=shape)
            t.fit(_data(shape, C, 24), epochs=1, verbose=False)        # two steps of 12 rows
            runs[rows] = [p.data[:] for p, _ in model.params()]
        big = 0.0
        for P in runs[12]:
            for v in P:
                big = max(big, abs(v))
        for rows in (1, 3, 4, 5):
            d = 0.0
            for P, Q in zip(runs[12], runs[rows]):
                for i in range(len(P)):
                    d = max(d, abs(P[i] - Q[i]))
            print("MICRO %s %d %.3e %.3e" % (opt, rows, d, big))


def calls():
    model = mf.models.iris_model()      # a Dense first: its input gradient is not needed
    shape, C = (4,), 3
    t = Trainer(model, mf.CrossEntropyLoss(), None, batch_size=8, input_shape=shape)
    K = mf.backend.K
    f = K.matmul_backward_input
    n = [0]

    def counted(*a):
        n[0] += 1
        return f(*a)
    K.matmul_backward_input = counted
    try:
        t.fit(_data(shape, C, 16), epochs=1, verbose=False)
    finally:
        K.matmul_backward_input = f
    print("CALLS %d %d" % (n[0], t.optimizer.steps))


def plan(kind, B, m):
    model, shape, C = _model(kind)
    ds = _data(shape, C, B)
    t = Trainer(model, mf.CrossEntropyLoss(), None, batch_size=B, micro_batch=m, input_shape=shape)
    t.use_data(ds)
    t.make_optimizer()
    # a first fit loads the kernel modules a step uses on first use (code, kept for good): it
    # runs, and gives its buffers back, before the measured one; it also sets what the model's
    # EncoderBlocks recompute (kept here: the heap has room), which the plan then measures
    t.fit(ds, epochs=1, verbose=False)
    t.release()
    p = t.plan()
    drop_scratch()
    gc.collect()
    a = gc.mem_alloc()
    t.fit(ds, epochs=1, verbose=False)
    gc.collect()
    print("PLAN %d %d" % (p["activations"] + p["batch_rows"], gc.mem_alloc() - a))


def release():
    model, shape, C = _model("conv")
    ds = _data(shape, C, 32)
    t = Trainer(model, mf.CrossEntropyLoss(), None, batch_size=32, micro_batch=16, input_shape=shape)
    # the kernel modules a step of this shape loads on first use (code, kept), the optimizer
    t.fit(ds, epochs=1, verbose=False)
    t.release()
    gc.collect()
    f0 = gc.mem_free()
    calls = [0]
    forward = model.forward

    def failing(x):                           # fails in the second micro-batch, after the buffers
        calls[0] += 1
        if calls[0] == 2:
            raise MemoryError("memory allocation failed")
        return forward(x)
    model.forward = failing
    try:
        t.fit(ds, epochs=1, batch_size=32, micro_batch=16, verbose=False)
        print("NO FAILURE")
    except MemoryError:
        pass
    model.forward = forward
    gc.collect()
    print("RELEASE %d" % (f0 - gc.mem_free()))


def refuse():
    # a fit(micro_batch='auto') whose optimizer is made but no micro-batch of which fits (the
    # plan's verdict stood in for by memplan.pick_micro answering None): refused before its
    # first step, with no optimizer left and the heap as before
    from microformer import memplan
    model, shape, C = _model("conv")
    ds = _data(shape, C, 32)
    t = Trainer(model, mf.CrossEntropyLoss(), None, batch_size=32, input_shape=shape)
    t.plan(32, 1)                      # loads the kernels a step needs (code, kept); grads made
    t.release()
    gc.collect()
    f0 = gc.mem_free()
    pick = memplan.pick_micro
    memplan.pick_micro = lambda t, batch, free: None
    try:
        t.fit(ds, epochs=1, micro_batch="auto", verbose=False)
        print("NO FAILURE")
    except MemoryError as e:
        print("REFUSED", "refused before its first step" in str(e))
    finally:
        memplan.pick_micro = pick
    gc.collect()
    print("OPTIMIZER", t.optimizer is None)
    print("KEPT %d" % (f0 - gc.mem_free()))
    t.fit(ds, epochs=1, micro_batch="auto", verbose=False)      # and the next fit runs
    print("FITTED", t.optimizer.steps)


if __name__ == "__main__":
    what = sys.argv[1]
    if what in ("micro", "calls") and len(sys.argv) > 2:
        mf.set_backend(sys.argv[2])
    if what == "micro":
        # SGD: the weights move by lr times the gradient (Adam's first steps divide by sqrt(v), so
        # a near-zero gradient summed in another order moves a weight by up to lr either way)
        micro(("sgd",))
    elif what == "calls":
        calls()
    elif what == "plan":
        plan(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif what == "refuse":
        refuse()
    else:
        release()
