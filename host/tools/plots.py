"""PNG plots of the sequence demos: training curves and every head's attention map.

    python host/tools/plots.py [--out build/plots] [--epochs 10] [--steps 300] [--cpython]

The demos train inside real MicroPython (viper backend: seconds, not minutes) unless --cpython;
the script there prints the history and the attention weights as JSON, and matplotlib draws them:
    digits_training.png    loss and training accuracy per epoch (held-out accuracy in the title)
    digits_attention.png   one held-out image and each head's row-to-row attention map
    charlm_training.png    the character model's smoothed loss
    charlm_attention.png   each head's causal attention over a generated sample
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

RUNNER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import microformer as mf
import digits, charlm
epochs, steps, backend = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("training digits (%d epochs)" % epochs)
d = digits.main(epochs=epochs, backend=backend, verbose=False)
train, test = digits.load_split()
img = [round(v * 16) for v in test.row(0)]
x = mf.Tensor((1, 64))
for i in range(64):
    x.data[i] = img[i] / 16.0
m = d["model"]
m.eval()
logits = m.forward(x)
blk = m[3]
pred = max(range(10), key=lambda k: logits.data[k])
dig = {"history": [dict((k, r[k]) for k in ("epoch", "loss", "acc")) for r in d["history"]],
       "train_acc": d["train_acc"], "test_acc": d["test_acc"], "image": img, "label": test.y[0],
       "pred": pred, "heads": [blk.attn.weights(0, h) for h in range(blk.attn.num_heads)]}
print("training the char model (%d steps)" % steps)
c = charlm.main(steps=steps, backend=backend, verbose=False)
cm = c["model"]
ids = charlm.encode(c["sample"], c["chars"])
cm.eval()
cm.forward(mf.Tensor.from_list([ids]))
att = cm[2].attn
ch = {"history": c["history"], "test_acc": c["test_acc"], "sample": c["sample"],
      "tokens_per_s": c["tokens_per_s"], "heads": [att.weights(0, h) for h in range(att.num_heads)]}
print("PLOTDATA " + json.dumps({"digits": dig, "charlm": ch}))
"""


def collect(epochs, steps, cpython=False):
    board = os.path.join(ROOT, "board", "demos")
    lib = os.path.join(ROOT, "lib")
    if cpython:
        cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n" % lib + RUNNER, board,
               str(epochs), str(steps), "python"]
        env = dict(os.environ)
    else:
        exe = os.environ.get("MICROPYTHON") or os.path.join(os.path.dirname(sys.executable), "micropython")
        cmd = [exe, "-X", "heapsize=16M", "-c", RUNNER, board, str(epochs), str(steps), "viper"]
        env = dict(os.environ, MICROPYPATH=lib)
    # the run's progress lines are passed on as they come; PLOTDATA carries the results
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    data = None
    lines = []
    for line in proc.stdout:
        if line.startswith("PLOTDATA "):
            data = json.loads(line[len("PLOTDATA "):])
        else:
            lines.append(line)
            print("plots: " + line.rstrip(), flush=True)
    err = proc.stderr.read()
    if proc.wait() != 0 or data is None:
        raise SystemExit("plots: the demo run failed:\n%s\n%s" % ("".join(lines)[-2000:], err[-2000:]))
    return data


def check_labels(fig, name):
    """Every plot has a title, axis labels, and a labelled colour bar when it shows a colour map;
    raises ValueError naming the PNG and what it lacks."""
    bars = [a for a in fig.axes if hasattr(a, "_colorbar")]
    plots = [a for a in fig.axes if not hasattr(a, "_colorbar")]
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    for i, a in enumerate(plots):
        # a twin axis (ax.twinx()) shares its x axis, title and x label with its partner
        twins = [o for o in plots if a.get_shared_x_axes().joined(a, o)] or [a]
        for what, text in (("title", title or "".join(o.get_title() for o in twins)),
                           ("x label", "".join(o.get_xlabel() for o in twins)),
                           ("y label", a.get_ylabel())):
            if not text:
                raise ValueError("plots: %s, panel %d has no %s" % (name, i, what))
    coloured = [im for a in plots for im in a.images if im.get_cmap().name not in ("gray", "gray_r")]
    if coloured and not bars:
        raise ValueError("plots: %s shows a colour map without a colour bar" % name)
    for b in bars:
        if not (b.get_ylabel() or b.get_xlabel()):
            raise ValueError("plots: %s has a colour bar without a label" % name)


def draw(data, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    os.makedirs(out, exist_ok=True)
    written = []

    def save(fig, name):
        check_labels(fig, name)
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
        print("wrote", os.path.relpath(path, ROOT), flush=True)

    d = data["digits"]
    ep = [r["epoch"] for r in d["history"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(ep, [r["loss"] for r in d["history"]], "o-", label="training loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    ax2.plot(ep, [100 * r["acc"] for r in d["history"]], "s--", color="tab:orange", label="training accuracy")
    ax2.set_ylabel("accuracy %")
    ax.set_title("digits: rows as tokens, EncoderBlock (held-out %.1f%%)" % (100 * d["test_acc"]))
    fig.legend(loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.1))
    save(fig, "digits_training.png")

    H = len(d["heads"])
    fig, axes = plt.subplots(1, H + 1, figsize=(3.8 * (H + 1), 3.4), layout="constrained")
    axes[0].imshow(np.array(d["image"]).reshape(8, 8), cmap="gray_r")
    axes[0].set_title("label %d, predicted %d" % (d["label"], d["pred"]))
    axes[0].set_ylabel("row")
    axes[0].set_xlabel("column")
    for h in range(H):
        im = axes[h + 1].imshow(np.array(d["heads"][h]), cmap="viridis", vmin=0, vmax=1)
        axes[h + 1].set_title("head %d" % h)
        axes[h + 1].set_xlabel("key row")
        axes[h + 1].set_ylabel("query row")
    fig.colorbar(im, ax=axes[1:], shrink=0.8).set_label("attention weight")
    fig.suptitle("digits: each head's attention between image rows")
    save(fig, "digits_attention.png")

    c = data["charlm"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in c["history"]], [r["loss"] for r in c["history"]], "o-")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (smoothed)")
    ax.set_title("char model: held-out next-char accuracy %.1f%%" % (100 * c["test_acc"]))
    save(fig, "charlm_training.png")

    H = len(c["heads"])
    text = c["sample"]
    fig, axes = plt.subplots(1, H, figsize=(6.5 * H, 6.5))
    axes = np.atleast_1d(axes)
    for h in range(H):
        im = axes[h].imshow(np.array(c["heads"][h]), cmap="viridis", vmin=0, vmax=1)
        axes[h].set_xticks(range(len(text)))
        axes[h].set_xticklabels(list(text), fontsize=7, family="monospace")
        axes[h].set_yticks(range(len(text)))
        axes[h].set_yticklabels(list(text), fontsize=7, family="monospace")
        axes[h].set_title("causal head %d" % h)
        axes[h].set_xlabel("key: earlier character")
        axes[h].set_ylabel("query: character being predicted from")
    fig.colorbar(im, ax=list(axes), shrink=0.6).set_label("attention weight")
    fig.suptitle("char model attention over %r (%.0f tokens/s through the KV cache)" % (text, c["tokens_per_s"]))
    save(fig, "charlm_attention.png")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "plots"))
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--cpython", action="store_true", help="train in CPython instead of MicroPython")
    a = ap.parse_args(argv)
    data = collect(a.epochs, a.steps, a.cpython)
    draw(data, a.out)
    print("digits held-out accuracy %.1f%%; char model held-out %.1f%%, %.0f tokens/s"
          % (100 * data["digits"]["test_acc"], 100 * data["charlm"]["test_acc"], data["charlm"]["tokens_per_s"]))
    return data


if __name__ == "__main__":
    main()
