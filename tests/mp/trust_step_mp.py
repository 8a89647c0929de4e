# The training step is all or nothing: a non-finite loss, gradient or update raises
# NonFiniteError with every weight, optimizer moment and the step counter bit for bit as before;
# a KeyboardInterrupt at any point of a step leaves the weights of the step before or of the
# completed step (an interrupt during the write is held and raised right after).
# Runs under CPython and MicroPython:  micropython tests/mp/trust_step_mp.py BACKEND OUT.json
import json
import sys
from array import array

import microformer as mf
from microformer import backend
from microformer.train import fit, train_step
from microformer.data import Dataset

NAN = float("nan")
INF = float("inf")


def err(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)
    return "no error"


def state(model, opt):
    """Every weight, every optimizer moment and the step counter, as bytes."""
    out = [bytes(p.data) for _, p in model.named_params()]
    for name in ("m", "v", "buffers"):
        for t in getattr(opt, name, None) or ():
            out.append(bytes(t.data))
    out.append(opt.steps)
    return out


def set_state(model, opt, s):
    k = 0
    for _, p in model.named_params():
        p.data[:] = array("f", s[k])
        k += 1
    for name in ("m", "v", "buffers"):
        for t in getattr(opt, name, None) or ():
            t.data[:] = array("f", s[k])
            k += 1
    opt.steps = s[k]


def finite(model):
    for _, p in model.named_params():
        for x in p.data:
            if x - x != 0.0:
                return False
    return True


def iris_like(seed=1):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(4, 16), mf.ActivationLayer("relu"), mf.Reshape((4, 4)),
                          mf.Attention(4, 2), mf.GlobalAvgPool(), mf.Dense(4, 3)])


def batch(seed=5, B=6):
    r = mf.Rng(seed)
    X = mf.Tensor.from_list([[r.uniform(-2, 2) for _ in range(4)] for _ in range(B)])
    return X, [r.randint(3) for _ in range(B)]


# ---- a kernel namespace that raises KeyboardInterrupt on chosen calls ------------------------
READ_ONLY = ("first_nonfinite", "sum_squares", "max_exponent", "max_exponent_pairs")     # kernels whose first argument is an input


class Interrupting:
    """Every kernel of `real`, counted; calls whose index is in `at` raise KeyboardInterrupt:
    'before' the kernel runs, 'after' it, or 'torn' (after it, with its first output buffer
    scribbled on, as a loop stopped half way would leave it)."""

    def __init__(self, real, at=(), mode="before"):
        self.calls = 0
        self.names = []
        for n in dir(real):
            f = getattr(real, n)
            if not n.startswith("_") and callable(f) and not isinstance(f, type):
                setattr(self, n, self._wrap(n, f, at, mode))

    def _wrap(self, name, f, at, mode):
        def call(*args):
            i = self.calls
            self.calls += 1
            self.names.append(name)
            if i in at and mode == "before":
                raise KeyboardInterrupt
            r = f(*args)
            if i in at:
                out = args[0] if args else None
                if isinstance(out, list) and out and isinstance(out[0], tuple):
                    out = out[0][0].data       # params_commit writes the weights of (param, grad) pairs
                if mode == "torn" and name not in READ_ONLY and out is not None and hasattr(out, "__len__") \
                        and len(out) and not isinstance(out, (bytes, bytearray)):
                    out[0] = 12345.0
                raise KeyboardInterrupt
            return r
        return call


def interrupt_everywhere(r, make_opt, tag):
    """Interrupt one step at each kernel call (3 ways) and at pairs of calls: the state after is
    bit for bit the state before the step or after the uninterrupted step."""
    real = backend.K
    model = iris_like()
    opt = make_opt(model)
    loss_fn = mf.CrossEntropyLoss()
    X, y = batch()
    for _ in range(2):                      # moments that are not zero
        train_step(model, loss_fn, opt, X, y)
    s0 = state(model, opt)
    counter = Interrupting(real)
    backend.K = counter
    try:
        train_step(model, loss_fn, opt, X, y)
    finally:
        backend.K = real
    s1 = state(model, opt)
    total = counter.calls
    writes = [i for i in range(total) if counter.names[i] == "params_commit"]   # the step's write
    # the commit starts with the update of the first tensor, the call before its first write
    commit = writes[0] - 1
    res = {"calls": total, "writes": len(writes), "tensors": len(opt.params), "pre": 0, "post": 0,
           "other": [], "no_interrupt": [], "write_not_completed": [], "commit_not_completed": [],
           "commit_kernel": counter.names[commit]}
    cases = [((i,), m) for i in range(total + 1) for m in ("before", "after", "torn")]
    # a second interrupt while the first is being handled (the restore and the redo)
    for i in writes[:2]:
        for k in range(1, 8):
            cases.append(((i, i + k), "torn"))
            cases.append(((i, i + k), "before"))
    for at, mode in cases:
        set_state(model, opt, s0)
        K = Interrupting(real, at, mode)
        backend.K = K
        raised = False
        try:
            train_step(model, loss_fn, opt, X, y)
        except KeyboardInterrupt:
            raised = True
        finally:
            backend.K = real
        s = state(model, opt)
        if s == s0:
            res["pre"] += 1
        elif s == s1:
            res["post"] += 1
        else:
            res["other"].append([list(at), mode])
        if at[0] < total and not raised:
            res["no_interrupt"].append([list(at), mode])
        if at[0] in writes and s != s1:
            res["write_not_completed"].append([list(at), mode])
        if commit <= at[0] < total and s != s1:
            res["commit_not_completed"].append([list(at), mode])
    r["interrupt_" + tag] = res


def fit_interrupted(r):
    """train.fit stops after the step an interrupt lands in, saying so; the weights are those of
    the last full step of an uninterrupted run."""
    real = backend.K
    mf.seed(2)
    Xs = []
    ys = []
    g = mf.Rng(9)
    for i in range(24):
        Xs.append([g.uniform(-2, 2) for _ in range(4)])
        ys.append(i % 3)
    data = Dataset(mf.Tensor.from_list(Xs), ys, ["a", "b", "c"])
    # reference: 3 uninterrupted steps (batches of 8: one epoch), then the 4th
    model = iris_like(3)
    opt = mf.Adam(model, lr=0.01)
    fit(model, mf.CrossEntropyLoss(), opt, data, epochs=1, batch_size=8, verbose=False)
    after3 = state(model, opt)
    # the same, interrupted during the optimizer write of step 2 (held, honoured after it)
    model = iris_like(3)
    opt = mf.Adam(model, lr=0.01)
    counter = Interrupting(real)
    backend.K = counter
    try:
        fit(model, mf.CrossEntropyLoss(), opt, data, epochs=1, batch_size=8, verbose=False)
    finally:
        backend.K = real
    writes = [i for i in range(counter.calls) if counter.names[i] == "params_commit"]
    per_step = len(writes) // 3
    model = iris_like(3)
    opt = mf.Adam(model, lr=0.01)
    backend.K = Interrupting(real, (writes[per_step],), "torn")      # step 2's write
    try:
        hist = fit(model, mf.CrossEntropyLoss(), opt, data, epochs=3, batch_size=8, verbose=True)
    finally:
        backend.K = real
    r["fit_hist"] = [[h["epoch"], h["steps"], h["interrupted"]] for h in hist]
    r["fit_steps"] = opt.steps
    # replay: fit draws its batches from Batches(data, 8, Rng(seed + 1)), seed 0; two full steps
    from microformer.data import Batches
    model2 = iris_like(3)
    opt2 = mf.Adam(model2, lr=0.01)
    k = 0
    for Xb, yb in Batches(data, 8, mf.Rng(1)):
        if k == 2:
            break
        train_step(model2, mf.CrossEntropyLoss(), opt2, Xb, yb)
        k += 1
    r["fit_after_is_last_full_step"] = state(model, opt) == state(model2, opt2)
    r["fit_differs_from_3"] = state(model, opt) != after3


def refused(r, tag, model, opt, step):
    """`step()` must raise NonFiniteError (or a subclass) and leave the state bit for bit."""
    before = state(model, opt)
    try:
        step()
        r[tag] = "no error"
        return
    except mf.NonFiniteError as e:
        r[tag] = "%s: %s" % (type(e).__name__, e)
    r[tag + "_unchanged"] = state(model, opt) == before


def run(backend_name):
    mf.set_backend(backend_name)
    r = {"backend": backend_name}
    ce = mf.CrossEntropyLoss()

    # a NaN / inf in the input: refused at the model's entry, nothing written
    model = iris_like()
    opt = mf.Adam(model)
    X, y = batch()
    train_step(model, ce, opt, X, y)
    X.data[5] = NAN
    refused(r, "nan_input", model, opt, lambda: train_step(model, ce, opt, X, y))
    X.data[5] = INF
    refused(r, "inf_input", model, opt, lambda: train_step(model, ce, opt, X, y))

    # a NaN gradient (however it got there): refused before anything is written
    X, y = batch()
    model.train()
    opt.zero_grad()
    ce.forward(model.forward(X), y)
    model.backward(ce.backward())
    model[0].dW.data[3] = NAN
    refused(r, "nan_grad", model, opt, opt.step)

    # SGD lr=10 on MSE: diverges; the step that would overflow a weight is refused
    for momentum in (0.0, 0.9):
        mf.seed(4)
        m2 = mf.Sequential([mf.Dense(2, 2)])
        sgd = mf.SGD(m2, lr=10.0, momentum=momentum)
        x = mf.Tensor.from_list([[1.0, -2.0], [0.5, 3.0]])
        t = mf.Tensor.from_list([[1.0, 0.0], [0.0, 1.0]])
        mse = mf.MSELoss()
        tag = "sgd_diverge_%g" % momentum
        r[tag] = "no error"
        for k in range(300):
            before = state(m2, sgd)
            try:
                sgd.zero_grad()
                mse.forward(m2.forward(x), t)
                m2.backward(mse.backward())
                sgd.step()
            except mf.NonFiniteError as e:
                r[tag] = "%s: %s" % (type(e).__name__, e)
                r[tag + "_unchanged"] = state(m2, sgd) == before
                r[tag + "_finite"] = finite(m2)
                r[tag + "_steps"] = k
                break

    # a finite loss (3.6e77 as a double) whose gradient is inf in float32
    mf.seed(4)
    m3 = mf.Sequential([mf.Dense(1, 1)])
    m3[0].W.data[0] = 3e38
    adam = mf.Adam(m3, lr=1e-3)
    x = mf.Tensor.from_list([[1.0]])
    t = mf.Tensor.from_list([[-3e38]])
    mse = mf.MSELoss()

    r["huge_loss"] = None

    def huge():
        adam.zero_grad()
        r["huge_loss"] = mse.forward(m3.forward(x), t)
        m3.backward(mse.backward())
        adam.step()
    refused(r, "inf_grad", m3, adam, huge)

    # a finite gradient whose square overflows Adam's v: 0.001 * (1e21)^2 > float32 max
    model = iris_like()
    opt = mf.Adam(model, lr=1e-3)
    X, y = batch()
    train_step(model, ce, opt, X, y)
    opt.zero_grad()
    model[5].dW.data[2] = 1e21
    refused(r, "v_overflow", model, opt, opt.step)
    # ... and the optimizer still works afterwards
    train_step(model, ce, opt, X, y)
    r["after_refusal_steps"] = opt.steps
    r["after_refusal_finite"] = finite(model)

    # clipping finite grads whose squares overflow a float (single precision): scaled, not zeroed
    a = mf.Tensor.from_list([1e20, -1e20])
    ga = mf.Tensor.from_list([1e20, -1e20])
    r["clip_norm"] = mf.clip_grad_norm([(a, ga)], 1.0)
    r["clip_grads"] = list(ga.data)

    # hyperparameters: finite and in range, or a message naming them
    d = lambda: mf.Dense(2, 2)
    hp = {}
    for name, make in (
            ("adam lr inf", lambda: mf.Adam(d(), lr=INF)), ("adam lr nan", lambda: mf.Adam(d(), lr=NAN)),
            ("adam lr 0", lambda: mf.Adam(d(), lr=0)), ("sgd lr -1", lambda: mf.SGD(d(), lr=-1.0)),
            ("adam beta1 1", lambda: mf.Adam(d(), betas=(1.0, 0.999))),
            ("adam beta2 nan", lambda: mf.Adam(d(), betas=(0.9, NAN))),
            ("adam betas 3", lambda: mf.Adam(d(), betas=(0.9, 0.99, 0.9))),
            ("adam eps 0", lambda: mf.Adam(d(), eps=0.0)), ("adam eps inf", lambda: mf.Adam(d(), eps=INF)),
            ("adam wd inf", lambda: mf.Adam(d(), weight_decay=INF)),
            ("sgd wd -1", lambda: mf.SGD(d(), weight_decay=-1.0)),
            ("sgd momentum inf", lambda: mf.SGD(d(), momentum=INF)),
            ("sgd momentum 1", lambda: mf.SGD(d(), momentum=1.0)),
            ("adam clip inf", lambda: mf.Adam(d(), max_grad_norm=INF)),
            ("adam clip 0", lambda: mf.Adam(d(), max_grad_norm=0.0)),
            ("layernorm eps inf", lambda: mf.LayerNorm(4, eps=INF)),
            ("adam lr str", lambda: mf.Adam(d(), lr="0.1"))):
        hp[name] = err(make)
    opt = mf.Adam(d())
    hp["adam set lr inf"] = err(setattr, opt, "lr", INF)
    r["hyper"] = hp

    # activations propagate NaN as torch does, forward and backward
    acts = {}
    x = mf.Tensor.from_list([[NAN, 2.0, -1.0, INF, -INF]])
    for kind in ("relu", "leaky_relu", "gelu", "tanh", "sigmoid"):
        a = mf.ActivationLayer(kind)
        y = a.forward(x)
        dx = a.backward(mf.Tensor.from_list([[1.0, NAN, 5.0, 1.0, 1.0]]))
        acts[kind] = [[str(v) for v in y.data], [str(v) for v in dx.data]]
    r["acts"] = acts

    # Ctrl-C at every point of a step
    interrupt_everywhere(r, lambda m: mf.Adam(m, lr=0.01), "adam")
    interrupt_everywhere(r, lambda m: mf.SGD(m, lr=0.05, momentum=0.9), "sgd")
    fit_interrupted(r)

    # the snapshot's memory, in summary()
    model = iris_like()
    info = model.summary((16, 4), show=False)
    opt = mf.Adam(model)
    r["summary"] = info
    r["snapshot_floats"] = opt.snapshot_floats()
    r["state_floats"] = opt.state_floats()
    r["params"] = model.param_count()
    r["largest"] = max([p.size for _, p in model.named_params()])
    return r


if __name__ == "__main__":
    res = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(res))
