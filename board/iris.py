# iris.py: the seed's Iris attention model, trained from scratch (board REPL, MicroPython or CPython).
#   >>> import iris; iris.main(epochs=100)
# Dense(4,32)+ReLU -> [B,4,8] -> Attention(8,2) -> GlobalAvgPool -> Dense(8,3); Adam 1e-3, batch 16.
import microformer as mf
from microformer.data import find_file, read_csv
from microformer.train import fit_and_evaluate

SPLIT_SEED = 7


def build_model(seed=1):
    mf.seed(seed)
    return mf.Sequential([
        mf.Dense(4, 32), mf.ActivationLayer("relu"),   # [B,4] -> [B,32]
        mf.Reshape((4, 8)),                            # 4 tokens of 8 features
        mf.Attention(8, 2),                            # [B,4,8]
        mf.GlobalAvgPool(),                            # [B,8]
        mf.Dense(8, 3),                                # logits [B,3]
    ])


def load_split(path=None, seed=SPLIT_SEED):
    """120/30 seeded split, standardized with the training rows' mean and std."""
    data = read_csv(find_file("iris.csv", path))
    train, test = data.split(120, seed)
    mean, std = train.stats()
    train.standardize(mean, std)
    test.standardize(mean, std)
    return train, test, mean, std


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
