# microformer.models: the seed's Iris attention model, written once as a spec.
#   Dense(4,32)+ReLU -> [B,4,8] -> Attention(8,2) -> GlobalAvgPool -> Dense(8,3)
# board/demos/iris.py, board/benchmarks/bench.py, host/tools/pretrain.py and the tests build it from here.
from .spec import from_spec
from .tensor import seed as _seed

IRIS_ARCH = "iris-attention-v1"     # the name older checkpoints carry in meta['arch']
IRIS_SPLIT_SEED = 7                 # the 120/30 split of datasets/iris.csv

IRIS_SPEC = {"type": "Sequential", "layers": [
    {"type": "Dense", "in_features": 4, "out_features": 32, "use_bias": True},    # [B,4] -> [B,32]
    {"type": "ActivationLayer", "kind": "relu"},
    {"type": "Reshape", "shape": [4, 8]},                                       # 4 tokens of 8
    {"type": "Attention", "embed_dim": 8, "num_heads": 2, "use_bias": True, "causal": False,
     "max_len": None},                                                           # [B,4,8]
    {"type": "GlobalAvgPool"},                                                   # [B,8]
    {"type": "Dense", "in_features": 8, "out_features": 3, "use_bias": True},    # logits [B,3]
]}


def iris_model(seed=1):
    """The seed's Iris model, freshly initialised with mf.seed(seed)."""
    _seed(seed)
    return from_spec(IRIS_SPEC)


def iris_split(path=None, seed=IRIS_SPLIT_SEED):
    """(train, test, mean, std): the 120/30 seeded split of iris.csv, standardized with the
    training rows' mean and std. path None: data.find_file looks in the usual places."""
    from .data import find_file, read_csv
    data = read_csv(find_file("iris.csv", path))
    train, test = data.split(120, seed)
    mean, std = train.stats()
    train.standardize(mean, std)
    test.standardize(mean, std)
    return train, test, mean, std
