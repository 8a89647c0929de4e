"""host/tools/plots.py: every PNG has a title, axis labels, and a labelled colour bar where it shows a
colour map (check_labels refuses a figure without them); the PNGs are written one by one, each
announced as it is written."""
import pytest

import helpers  # noqa: F401  (import path)
import plots

S = "the dog "


def _data():
    heads8 = [[[1.0 / 8] * 8 for _ in range(8)] for _ in range(2)]
    causal = [[[1.0 / (i + 1) if j <= i else 0.0 for j in range(len(S))] for i in range(len(S))]
              for _ in range(2)]
    return {"digits": {"history": [{"epoch": 1, "loss": 2.0, "acc": 0.3}, {"epoch": 2, "loss": 1.5, "acc": 0.5}],
                       "train_acc": 0.5, "test_acc": 0.4, "image": list(range(64)), "label": 3, "pred": 3,
                       "heads": heads8},
            "charlm": {"history": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}], "test_acc": 0.3,
                       "sample": S, "tokens_per_s": 1000.0, "heads": causal}}


def test_every_png_is_labelled(tmp_path, capsys):
    written = plots.draw(_data(), str(tmp_path))
    names = [p.rsplit("/", 1)[-1] for p in written]
    assert names == ["digits_training.png", "digits_attention.png", "charlm_training.png",
                     "charlm_attention.png"]
    out = capsys.readouterr().out.splitlines()
    assert [l.rsplit("/", 1)[-1] for l in out if l.startswith("wrote ")] == names


def test_check_labels_refuses_unlabelled_figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots()
    ax.imshow(np.eye(3), cmap="viridis")
    ax.set_title("t")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    with pytest.raises(ValueError, match="m.png shows a colour map without a colour bar"):
        plots.check_labels(fig, "m.png")
    cb = fig.colorbar(ax.images[0], ax=ax)
    with pytest.raises(ValueError, match="m.png has a colour bar without a label"):
        plots.check_labels(fig, "m.png")
    cb.set_label("weight")
    plots.check_labels(fig, "m.png")
    ax.set_xlabel("")
    with pytest.raises(ValueError, match="m.png, panel 0 has no x label"):
        plots.check_labels(fig, "m.png")
    plt.close(fig)
