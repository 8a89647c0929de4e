# bench.py: training-step speed and heap use of both kernel backends (board REPL or unix port).
#   >>> import bench; bench.main()          # every model, every backend this interpreter has
#   >>> bench.memory()                      # heap after import, after the first Iris step, per step
#   >>> bench.session()                     # an Iris fine-tune session (needs /model.mfck, /data)
#   >>> import bench_sustained; bench_sustained.main()   # the same rates without a collection per round
# Prints one table; host/bench/bench_all.py runs this file under the unix port and parses the RESULT/MEM lines.
import gc
import sys
import time

_mem_alloc = getattr(gc, "mem_alloc", lambda: -1)    # MicroPython; CPython has no heap figure
gc.collect()
_HEAP_START = _mem_alloc()
import microformer as mf                              # noqa: E402  (the heap it takes is measured)
gc.collect()
_HEAP_IMPORT = _mem_alloc()

try:
    from micropython import mem_peak as _mem_peak    # unix port only; not on the esp32 port
except ImportError:
    _mem_peak = None

if hasattr(time, "ticks_us"):
    def _us():
        return time.ticks_us()

    def _dt(t0):
        return time.ticks_diff(time.ticks_us(), t0)
else:                                                 # CPython
    def _us():
        return int(time.perf_counter() * 1e6)

    def _dt(t0):
        return _us() - t0


def _iris():
    # the seed's Iris model at batch 16: x [16,4] -> logits [16,3]
    from microformer.models import iris_model
    return iris_model(1), (16, 4), 3


def _block():
    # a larger attention block: E=64, S=32, H=4, B=8; x [8,32,16] -> Dense -> Attention -> GAP -> Dense
    mf.seed(2)
    model = mf.Sequential([mf.Dense(16, 64), mf.Attention(64, 4), mf.GlobalAvgPool(), mf.Dense(64, 4)])
    return model, (8, 32, 16), 4


MODELS = {"iris": _iris, "block": _block}

# the decode stack: Embedding -> PositionalEncoding -> EncoderBlock(E=32, H=2, causal) -> LayerNorm
# -> Dense, a 16-token prompt then 48 new tokens through the KV cache
DECODE_V = 32
DECODE_E = 32
DECODE_PROMPT = 16
DECODE_NEW = 48


def _decoder(activation="gelu"):
    # a model that only decodes: eval mode, and frozen (trainable = False releases its grad
    # buffers, as much heap as the weights; `model.trainable = True` gives them back zeroed)
    mf.seed(4)
    E = DECODE_E
    L = DECODE_PROMPT + DECODE_NEW
    model = mf.Sequential([mf.Embedding(DECODE_V, E), mf.PositionalEncoding(L, E),
                           mf.EncoderBlock(E, 2, 4 * E, causal=True, activation=activation, max_len=L),
                           mf.LayerNorm(E), mf.Dense(E, DECODE_V)])
    model.eval()
    model.trainable = False
    return model


def decode_setup(backend, activation="gelu"):
    """The decode stack on `backend`, its prompt [1, DECODE_PROMPT], a one-token input [1, 1] and
    the greedy pick argmax(data, offset, n) (its module loaded before the model is made: the
    model's arrays then come after the module's code in the heap)."""
    mf.set_backend(backend)
    argmax = mf.train.argmax
    model = _decoder(activation)
    prompt = mf.Tensor((1, DECODE_PROMPT))
    for i in range(DECODE_PROMPT):
        prompt.data[i] = (3 * i + 1) % DECODE_V
    return model, prompt, mf.Tensor((1, 1)), argmax


def decode(backend, activation="gelu", rounds=3):
    """Greedy decoding on the decode stack: tokens per second of the 48 cached decode steps (the
    fastest of `rounds` rounds, prompt excluded) and heap bytes per decoded token (gc.mem_alloc
    delta over a whole round of decode steps, GC off). Prints a DECODE line."""
    model, prompt, x, argmax = decode_setup(backend, activation)
    V = DECODE_V

    def one_round():
        logits = mf.prefill(model, prompt)
        nxt = argmax(logits.data, (DECODE_PROMPT - 1) * V, V)
        t0 = _us()
        for _ in range(DECODE_NEW):
            x.data[0] = nxt
            logits = mf.decode_step(model, x)
            nxt = argmax(logits.data, 0, V)
        return _dt(t0), nxt
    one_round()                                  # buffers and caches get allocated here
    best = None
    for _ in range(rounds):
        gc.collect()
        dt, last = one_round()
        best = dt if best is None or dt < best else best
    logits = mf.prefill(model, prompt)
    nxt = argmax(logits.data, (DECODE_PROMPT - 1) * V, V)
    gc.collect()
    gc.disable()
    try:
        a0 = _mem_alloc()
        for _ in range(DECODE_NEW):
            x.data[0] = nxt
            logits = mf.decode_step(model, x)
            nxt = argmax(logits.data, 0, V)
        heap = (_mem_alloc() - a0) / DECODE_NEW if a0 >= 0 else -2.0
    except MemoryError:                  # the portable path can allocate more than the heap
        heap = -1.0
    finally:
        gc.enable()
    tps = DECODE_NEW * 1e6 / max(1, best)
    print("DECODE %s %s %.2f %.1f %d" % (backend, activation, tps, heap, last))
    return tps, heap


def _batch(shape, classes):
    rng = mf.Rng(3)
    x = mf.Tensor(shape)
    for i in range(x.size):
        x.data[i] = rng.uniform(-1.0, 1.0)
    labels = [i % classes for i in range(shape[0])]
    return x, labels


def run(model_name, backend, steps=None, warmup=3, rounds=None):
    """Time `rounds` rounds of `steps` training steps; return a dict with ms per step and the
    fwd/bwd/opt split of the fastest round (the minimum is what a shared, noisy machine can
    reproduce; the board itself is quiet)."""
    mf.set_backend(backend)
    model, shape, classes = MODELS[model_name]()
    opt = mf.Adam(model, lr=1e-3)
    loss_fn = mf.CrossEntropyLoss()
    x, labels = _batch(shape, classes)
    if steps is None:
        fast = backend != "python"
        steps = (30 if fast else 5) if model_name == "iris" else (5 if fast else 1)
    if rounds is None:
        rounds = 1 if (model_name == "block" and backend == "python") else 3
    for _ in range(warmup):                      # buffers get allocated here
        opt.zero_grad()
        loss_fn.forward(model.forward(x), labels)
        model.backward(loss_fn.backward(), True, False)   # grads; need_dx False: the input gradient is not used
        opt.step()
    gc.collect()
    best = None
    for _ in range(rounds):
        tf = tb = to = 0
        for _ in range(steps):
            t0 = _us()
            opt.zero_grad()
            loss_fn.forward(model.forward(x), labels)
            t1 = _us()
            model.backward(loss_fn.backward(), True, False)   # grads; need_dx False: the input gradient is not used
            t2 = _us()
            opt.step()
            t3 = _us()
            tf += t1 - t0
            tb += t2 - t1
            to += t3 - t2
        if best is None or tf + tb + to < best[0] + best[1] + best[2]:
            best = (tf, tb, to)
    tf, tb, to = best
    # heap bytes one steady-state step allocates (GC off so nothing is freed meanwhile)
    gc.collect()
    gc.disable()
    try:
        a0 = _mem_alloc()
        opt.zero_grad()
        loss_fn.forward(model.forward(x), labels)
        model.backward(loss_fn.backward(), True, False)   # grads; need_dx False: the input gradient is not used
        opt.step()
        alloc = _mem_alloc() - a0 if a0 >= 0 else -2
    except MemoryError:                  # the portable path can allocate more than the heap
        alloc = -1
    finally:
        gc.enable()
    total = tf + tb + to
    r = {"model": model_name, "backend": backend, "batch": shape[0], "steps": steps,
         "ms": total / steps / 1000.0, "fwd": tf / steps / 1000.0, "bwd": tb / steps / 1000.0,
         "opt": to / steps / 1000.0, "alloc": alloc, "peak": _mem_peak() if _mem_peak else -1,
         "us_sample": total / steps / shape[0]}
    print("RESULT %s %s %d %.4f %.4f %.4f %.4f %d %d %.2f" % (
        model_name, backend, steps, r["ms"], r["fwd"], r["bwd"], r["opt"], r["alloc"], r["peak"],
        r["us_sample"]))
    return r


def memory(steps=20):
    """Heap of the Iris model on the current backend, one MEM line per figure, printed as it goes:
    heap in use after `import microformer` (gc.mem_alloc after a collection; what the import
    added), after the model, Adam and the first training step, and the garbage one steady-state
    step leaves (gc.mem_alloc delta over `steps` steps with the GC off, divided by `steps`)."""
    out = {"import": _HEAP_IMPORT, "import_added": _HEAP_IMPORT - _HEAP_START}
    print("MEM import %d %d" % (out["import"], out["import_added"]))
    model, shape, classes = _iris()
    opt = mf.Adam(model, lr=1e-3)
    loss_fn = mf.CrossEntropyLoss()
    x, labels = _batch(shape, classes)

    def step():
        opt.zero_grad()
        loss_fn.forward(model.forward(x), labels)
        model.backward(loss_fn.backward(), True, False)   # grads; need_dx False: the input gradient is not used
        opt.step()
    step()
    gc.collect()
    out["first_step"] = gc.mem_alloc()
    print("MEM first_step %d %s" % (out["first_step"], mf.get_backend()))
    for _ in range(3):
        step()
    gc.collect()
    gc.disable()
    try:
        a0 = gc.mem_alloc()
        for _ in range(steps):
            step()
        out["per_step"] = (gc.mem_alloc() - a0) / steps
    finally:
        gc.enable()
    print("MEM per_step %.1f %d" % (out["per_step"], steps))
    return out


def fit_heap(path="datasets/iris.csv", warm=2, epochs=3, batch=16):
    """The real fit loop: train.fit on Iris (120 rows, batch 16: each epoch ends with a batch of
    8) on the current backend; heap bytes per step over `epochs` whole epochs after `warm` (GC
    off). Prints a FITHEAP line: backend, steps, bytes per step, epochs, rows, batch size."""
    import iris
    tr = iris.load_split(path)[0]
    model = iris.build_model(1)
    opt = mf.Adam(model, lr=1e-3)
    lf = mf.CrossEntropyLoss()
    mf.train.fit(model, lf, opt, tr, epochs=warm, batch_size=batch, verbose=False)
    gc.collect()
    gc.disable()
    try:
        a0 = _mem_alloc()
        s0 = opt.steps
        mf.train.fit(model, lf, opt, tr, epochs=epochs, batch_size=batch, verbose=False)
        steps = opt.steps - s0
        per = (_mem_alloc() - a0) / steps if a0 >= 0 else -1.0
    finally:
        gc.enable()
    print("FITHEAP %s %d %.1f %d %d %d" % (mf.get_backend(), steps, per, epochs, len(tr), batch))
    return per


def opt_steps(kind, n):
    """n optimizer steps (after one) of Adam or SGD (momentum 0.9) on the Iris model's gradients:
    what host/bench/bench_all.py counts instructions of (two runs, n and 0 steps)."""
    model, shape, classes = _iris()
    opt = mf.Adam(model, lr=1e-3) if kind == "adam" else mf.SGD(model, lr=1e-2, momentum=0.9)
    x, labels = _batch(shape, classes)
    lf = mf.CrossEntropyLoss()
    lf.forward(model.forward(x), labels)
    model.backward(lf.backward())
    opt.step()
    gc.collect()                 # the same heap state before the n steps, whatever n is
    for _ in range(n):
        opt.step()
    print("OPT %s %d %d" % (kind, n, model.param_count()))


def session(root=None, epochs=1):
    """An Iris fine-tune session as on the board: finetune.Session on the pretrained checkpoint,
    a short fit (`epochs` over the training split), evaluate. Prints SESSION, the accuracy and
    what the session's module was loaded from ('.py': compiled at import, '.mpy': precompiled,
    as `make deploy` sends it)."""
    import finetune
    s = finetune.Session(root=root, verbose=False)
    s.fit(epochs=epochs, data="train", verbose=False)
    r = s.evaluate(verbose=False)
    src = getattr(sys.modules["mf_session"], "__file__", "")
    print("SESSION ok %.4f %s" % (r["accuracy"], src[src.rfind("."):] or "frozen"))
    return r


def table(rows):
    print("%-6s %-7s %10s %8s %8s %8s %10s %10s %9s %7s" % (
        "model", "backend", "ms/step", "fwd", "bwd", "opt", "alloc B", "peak B", "us/sample", "speedup"))
    base = {}
    for r in rows:
        if r["backend"] == "python":
            base[r["model"]] = r["ms"]
    for r in rows:
        b = base.get(r["model"])
        print("%-6s %-7s %10.3f %8.3f %8.3f %8.3f %10s %10s %9.1f %7s" % (
            r["model"], r["backend"], r["ms"], r["fwd"], r["bwd"], r["opt"],
            r["alloc"] if r["alloc"] >= 0 else ">heap",
            r["peak"] if r["peak"] >= 0 else "n/a", r["us_sample"],
            ("x%.1f" % (b / r["ms"])) if b else ""))


def main(models=("iris", "block"), backends=None):
    backends = backends or mf.available_backends()
    rows = []
    for m in models:
        for b in backends:
            rows.append(run(m, b))
            gc.collect()
    table(rows)
    return rows


if __name__ == "__main__":
    argv = getattr(sys, "argv", [])
    if len(argv) >= 2 and argv[1] == "memory":       # bench.py memory: the MEM lines
        memory()
    elif len(argv) >= 3 and argv[1] == "decode":     # bench.py decode BACKEND [ACTIVATION [ROUNDS]]
        decode(argv[2], argv[3] if len(argv) > 3 else "gelu", int(argv[4]) if len(argv) > 4 else 3)
    elif len(argv) >= 3 and argv[1] == "fitheap":    # bench.py fitheap BACKEND
        mf.set_backend(argv[2])
        fit_heap()
    elif len(argv) >= 4 and argv[1] == "opt":        # bench.py opt BACKEND adam|sgd N
        mf.set_backend(argv[2])
        opt_steps(argv[3], int(argv[4]) if len(argv) > 4 else 0)
    elif len(argv) >= 2 and argv[1] == "session":    # bench.py session ROOT: one fine-tune session
        session(argv[2] if len(argv) > 2 else None)
    elif len(argv) >= 3:                 # bench.py MODEL BACKEND [STEPS [ROUNDS]]: one row (host/bench/bench_all.py)
        run(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else None,
            rounds=int(argv[4]) if len(argv) > 4 else None)
    else:
        main()
