# iris.py: the seed's Iris attention model, trained from scratch (board REPL, MicroPython or CPython).
#   >>> import iris; iris.main(epochs=100)
# The model is microformer.models.IRIS_SPEC: Dense(4,32)+ReLU -> [B,4,8] -> Attention(8,2) ->
# GlobalAvgPool -> Dense(8,3); Adam 1e-3, batch 16.
import microformer as mf
from microformer.models import IRIS_SPLIT_SEED as SPLIT_SEED, iris_model as build_model, iris_split
from microformer.train import fit_and_evaluate


def load_split(path=None, seed=SPLIT_SEED):
    """120/30 seeded split, standardized with the training rows' mean and std."""
    return iris_split(path, seed)


def main(epochs=100, backend=None, seed=1, verbose=True, path=None, lr=1e-3, batch_size=16):
    if backend:
        mf.set_backend(backend)
    train, test, _, _ = load_split(path)
    result = fit_and_evaluate(build_model(seed), train, test, epochs, batch_size, lr, seed, verbose)
    del result["history"]
    train_acc, test_acc = result["train_acc"], result["test_acc"]
    if verbose:
        print("backend %s: train accuracy %.2f%% (%d/%d), test accuracy %.2f%% (%d/%d), %.3f s/epoch"
              % (result["backend"], 100 * train_acc, round(train_acc * len(train)), len(train),
                 100 * test_acc, round(test_acc * len(test)), len(test), result["s_per_epoch"]))
    return result


if __name__ == "__main__":
    main()
