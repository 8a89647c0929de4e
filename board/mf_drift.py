# mf_drift.py: the drift demo's sensor, whose readings drift by a fixed scale and offset per
# feature, and the drifted examples a Session reads through it (s.drifted_examples). It imports
# no session code: mf_session imports it on first use.
from mf_exfile import fmt
from microformer.tensor import Rng

# The demo's drifting sensor: reading = true value * scale + offset, per feature (cm).
DRIFT_SCALE = (1.1, 0.9, 0.6, 0.5)
DRIFT_OFFSET = (0.4, -0.3, 1.2, 0.7)


def drift(features, scale=DRIFT_SCALE, offset=DRIFT_OFFSET):
    """What the drifted sensor reads for true `features`: x * scale + offset per feature."""
    return [features[j] * scale[j] + offset[j] for j in range(len(features))]


def drifted_examples(task, input_shape, classes, raw, n=None, part="train", scale=None, offset=None,
                     seed=0):
    """(features, label) pairs as the drifted sensor reads base rows (raw units).

    task, input_shape, classes: the session's model; raw(part) -> (flat raw rows, class
    indices): the session's rows of a selection. part: 'train', 'test' or 'base' rows; n: how many (None: all), picked
    with `seed` and balanced over the classes; scale, offset: the drift (None: DRIFT_SCALE,
    DRIFT_OFFSET).
    """
    if task != "classify" or len(input_shape) != 1:
        raise ValueError("drifted_examples: the drift demo needs a classifier over flat features "
                         "(the Iris model); this one is a %s model with input %s"
                         % (task, input_shape))
    scale = DRIFT_SCALE if scale is None else scale
    offset = DRIFT_OFFSET if offset is None else offset
    if part not in ("train", "test", "base"):
        raise ValueError("drifted_examples: part must be 'train', 'test' or 'base', got %r" % (part,))
    F = input_shape[0]
    if len(scale) != F or len(offset) != F:
        raise ValueError("drifted_examples: scale and offset need %d values each" % F)
    X, y = raw(part)
    order = list(range(len(y)))
    if n is not None:
        if not isinstance(n, int) or not 0 < n <= len(y):
            raise ValueError("drifted_examples: n must be an int in 1..%d, got %r" % (len(y), n))
        Rng(seed + 1).shuffle(order)
        per = [[i for i in order if y[i] == c] for c in range(len(classes))]
        order = []
        k = 0
        while len(order) < n:                   # round robin over the classes
            for c in range(len(per)):
                if k < len(per[c]) and len(order) < n:
                    order.append(per[c][k])
            k += 1
    out = []
    for i in order:
        raw = [X[i * F + j] for j in range(F)]
        out.append(([float(fmt(v)) for v in drift(raw, scale, offset)], classes[y[i]]))
    return out
