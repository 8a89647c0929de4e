# bench_sustained.py: the rates a user's own loop sustains, next to the bench's collected ones.
#   >>> import bench_sustained; bench_sustained.main()
# The collected rate collects garbage before each timed round (as bench.decode and bench.run
# do); the sustained rate runs the same rounds back to back with no collection, as a user's
# loop does. A hot path that allocates (a heap frame, a boxed float) slows down as garbage
# builds up, so the ratio sustained / collected shows it. Prints SUSTAINED lines.
import gc

import bench
import microformer as mf

try:
    from micropython import mem_total as _mem_total   # unix ports: bytes ever allocated (frames included)
except ImportError:
    _mem_total = None


def _allocated(fn, n):
    # heap bytes fn() allocates per call over n calls, freed or not (heap frames are freed on
    # return, so gc.mem_alloc misses them); -1 where the port has no mem_total
    if _mem_total is None:
        return -1
    a0 = _mem_total()
    for _ in range(n):
        fn()
    return (_mem_total() - a0) // n


def _timed(fn, rounds, collect):
    # the summed time of `rounds` calls of fn() (fn returns its own timed microseconds)
    total = 0
    for _ in range(rounds):
        if collect:
            gc.collect()
        total += fn()
    return total


def decode(backend, rounds=200, only=None):
    """Tokens per second of the bench's decode stack (bench.decode), collected and sustained, and
    the heap bytes a round allocates per token (prefill's share included)."""
    gc.collect()                                 # the imports' garbage gone before the model is made
    model, prompt, x, argmax = bench.decode_setup(backend)
    P, V, NEW = bench.DECODE_PROMPT, bench.DECODE_V, bench.DECODE_NEW

    def one_round():
        logits = mf.prefill(model, prompt)
        nxt = argmax(logits.data, (P - 1) * V, V)
        t0 = bench._us()
        for _ in range(NEW):
            x.data[0] = nxt
            logits = mf.decode_step(model, x)
            nxt = argmax(logits.data, 0, V)
        return bench._dt(t0)
    gc.collect()                                 # the model's construction garbage gone first
    one_round()                                  # buffers and caches get allocated here
    if only is not None:                         # one kind of round alone (instruction counts)
        _timed(one_round, rounds, only == "collected")
        return None
    col = _timed(one_round, rounds, True)
    gc.collect()
    sus = _timed(one_round, rounds, False)
    r = (rounds * NEW * 1e6 / max(1, col), rounds * NEW * 1e6 / max(1, sus), _allocated(one_round, 4) // NEW)
    print("SUSTAINED decode %s %d %.1f %.1f %d" % (backend, rounds, r[0], r[1], r[2]))
    return r


def fit(backend, steps=300):
    """Training steps per second of the Iris model (bench.run's step), collected and sustained, and
    the heap bytes one step allocates."""
    mf.set_backend(backend)
    model, shape, classes = bench.MODELS["iris"]()
    opt = mf.Adam(model, lr=1e-3)
    loss_fn = mf.CrossEntropyLoss()
    x, labels = bench._batch(shape, classes)

    def one_step():
        t0 = bench._us()
        opt.zero_grad()
        loss_fn.forward(model.forward(x), labels)
        model.backward(loss_fn.backward(), True, False)   # grads; need_dx False: the input gradient is not used
        opt.step()
        return bench._dt(t0)
    for _ in range(3):
        one_step()
    col = _timed(one_step, steps, True)
    gc.collect()
    sus = _timed(one_step, steps, False)
    r = (steps * 1e6 / max(1, col), steps * 1e6 / max(1, sus), _allocated(one_step, 10))
    print("SUSTAINED fit %s %d %.1f %.1f %d" % (backend, steps, r[0], r[1], r[2]))
    return r


def main(backend="viper"):
    return {"decode": decode(backend), "fit": fit(backend)}


if __name__ == "__main__":
    import sys
    argv = getattr(sys, "argv", [])
    what = argv[1] if len(argv) > 1 else "all"
    b = argv[2] if len(argv) > 2 else "viper"
    n = int(argv[3]) if len(argv) > 3 else None
    if what == "decode":                         # decode BACKEND [ROUNDS [collected|sustained]]
        decode(b, n or 200, argv[4] if len(argv) > 4 else None)
    elif what == "fit":
        fit(b, n or 300)
    else:
        main(b)
