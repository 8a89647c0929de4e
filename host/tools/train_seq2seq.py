"""Train the digit-reversal encoder-decoder (board/demos/seq2seq.py) on the host (CPython, NumPy backend)
and write the checkpoint board/demos/seq2seq.py decodes: its metadata carries the model spec
(mf.load_model rebuilds it) and the task it was trained for.

    python host/tools/train_seq2seq.py --steps 1500 --out build/seq2seq.mfck
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (os.path.join(ROOT, "lib"), os.path.join(ROOT, "board", "demos")):
    if p not in sys.path:
        sys.path.insert(0, p)
import microformer as mf  # noqa: E402
from microformer.tensor import Rng, Tensor  # noqa: E402
import seq2seq  # noqa: E402


def train(steps=1500, batch_size=32, lr=3e-3, seed=1, verbose=True, **model_kw):
    """(model, meta): Adam on fresh random strings each step (never a held-out one)."""
    model = seq2seq.build_model(seed, **model_kw)
    held = set(tuple(s) for s in seq2seq.heldout())
    rng = Rng(seed + 100)
    opt = mf.Adam(model.parameters(), lr=lr, max_grad_norm=1.0)
    loss_fn = mf.CrossEntropyLoss()
    S = seq2seq.MAX_LEN + 1
    t0 = time.time()
    avg = None
    for step in range(1, steps + 1):
        strings = []
        while len(strings) < batch_size:
            s = seq2seq.sample(rng)
            if tuple(s) not in held:
                strings.append(s)
        src, lengths, tgt, labels = seq2seq.training_batch(strings)
        # a linear warm-down of the rate over the second half
        opt.lr = lr * min(1.0, 2.0 * (steps - step + 1) / steps)
        opt.zero_grad()
        logits = model.forward(src, tgt, lengths)
        loss = loss_fn.forward(Tensor((batch_size * S, seq2seq.TGT_VOCAB), logits.data), labels)
        model.backward(Tensor(logits.shape, loss_fn.backward().data))
        opt.step()
        avg = loss if avg is None else 0.98 * avg + 0.02 * loss
        if verbose and (step % 250 == 0 or step == steps):
            print("step %d: loss %.4f (%.1f s)" % (step, avg, time.time() - t0))
    meta = {"spec": mf.to_spec(model),
            "task": {"name": "reverse", "min_len": seq2seq.MIN_LEN, "max_len": seq2seq.MAX_LEN,
                     "heldout_seed": seq2seq.HELDOUT_SEED},
            "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
            "train_seconds": time.time() - t0, "final_loss": avg}
    return model, meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "seq2seq.mfck"))
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be >= 1, got %d" % a.steps)
    model, meta = train(a.steps, a.batch_size, a.lr, a.seed, verbose=not a.quiet)
    r = seq2seq.evaluate(model, seq2seq.heldout())
    meta["host_heldout_exact"] = r["exact"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    mf.save_checkpoint(a.out, model, meta)
    print("host (%s backend): %d steps in %.1f s, held-out exact match %.1f%% (%d strings; copying the "
          "input: %.1f%%), %d parameters -> %s" % (mf.get_backend(), a.steps, meta["train_seconds"],
                                                   100 * r["exact"], r["n"], 100 * r["copy"],
                                                   model.param_count(), a.out))


if __name__ == "__main__":
    main()
