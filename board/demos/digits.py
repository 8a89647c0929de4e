# digits.py: 8x8 handwritten digits as sequences - each image row is a token of 8 pixels - classified
# by a transformer encoder block (board REPL, MicroPython or CPython).
#   >>> import digits; digits.main(epochs=10)
# [B,64] -> [B,8 rows,8 px] -> Dense(8,E) -> PositionalEncoding -> EncoderBlock(E,2,2E) -> GlobalAvgPool
# -> Dense(E,10). A row token alone cannot tell a 3 from an 8: the block must mix rows (attention).
import gc

import microformer as mf
from microformer.data import find_file, read_csv
from microformer.train import fit_and_evaluate

CLASSES = [str(d) for d in range(10)]
SPLIT_SEED = 11


def build_model(seed=1, embed_dim=16, num_heads=2):
    mf.seed(seed)
    E = embed_dim
    return mf.Sequential([
        mf.Reshape((8, 8)),                        # [B,64] -> 8 row tokens of 8 pixels
        mf.Dense(8, E),                            # token embedding [B,8,E]
        mf.PositionalEncoding(8, E),               # which row is which
        mf.EncoderBlock(E, num_heads, 2 * E),      # rows attend to rows
        mf.GlobalAvgPool(),                        # [B,E]
        mf.Dense(E, 10),                           # logits
    ])


def load_split(path=None, n_train=500, n_test=300, seed=SPLIT_SEED):
    """A seeded shuffle of the 1797 images: n_train to train on, the next n_test held out.
    Pixels 0..16 are scaled to 0..1."""
    data = read_csv(find_file("digits.csv", path), CLASSES)
    if n_train + n_test > len(data):
        raise ValueError("digits: n_train + n_test must be <= %d, got %d" % (len(data), n_train + n_test))
    d = data.X.data
    for i in range(len(d)):
        d[i] *= 1.0 / 16.0
    idx = mf.Rng(seed).shuffle(list(range(len(data))))
    train = data.subset(idx[:n_train])
    test = data.subset(idx[n_train:n_train + n_test])
    del data
    gc.collect()
    return train, test


def main(epochs=10, backend=None, verbose=True, seed=1, path=None, n_train=500, n_test=300,
         lr=5e-3, batch_size=16, embed_dim=16):
    """Train from scratch; returns accuracies, timings, the per-epoch history and the model."""
    if backend:
        mf.set_backend(backend)
    train, test = load_split(path, n_train, n_test)
    model = build_model(seed, embed_dim)
    if verbose:
        model.summary((batch_size, 64))
    result = fit_and_evaluate(model, train, test, epochs, batch_size, lr, seed, verbose)
    result["model"] = model
    train_acc, test_acc = result["train_acc"], result["test_acc"]
    if verbose:
        print("backend %s: train accuracy %.2f%% (%d images), held-out accuracy %.2f%% (%d images), %.1f s/epoch"
              % (result["backend"], 100 * train_acc, len(train), 100 * test_acc, len(test),
                 result["s_per_epoch"]))
    return result


def show_attention(model, image, h=0):
    """Heat map of which rows each row attends to, for one 64-pixel image (list of 0..16 ints)."""
    x = mf.Tensor((1, 64))
    for i in range(64):
        x.data[i] = image[i] / 16.0
    model.eval()
    model.forward(x)
    model.train()
    return mf.show(model[3], 0, h)


if __name__ == "__main__":
    main()
