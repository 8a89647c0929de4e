# microformer.loss: losses that return the mean loss and write the gradient of their input.
from . import backend
from .finite import NonFiniteError
from .layer import Buffered, check_tensor, shape_error



class NonFiniteLossError(NonFiniteError):
    """The loss came out as nan or inf: the step is refused, the weights stay as they were."""


_F32_MAX = 3.4028234663852886e38       # the largest float32: a board computes the loss in float32


def _check_finite(who, value):
    # judged as float32: a loss past its range (3e38 vs -3e38 gives 3.6e77 in a double) is inf
    # on a board, and so is the gradient written with it
    if value != value or not -_F32_MAX <= value <= _F32_MAX:
        raise NonFiniteLossError("%s: loss is not finite as float32 (%r); refusing to train on it "
                                 "(lower the learning rate or check the inputs)" % (who, value))
    return value


def _len(x):
    # len(x), or -1 for an object without one
    try:
        return len(x)
    except TypeError:
        return -1


def _labels_ok(labels, B, C):
    # labels is B ints in [0, C) (bools refused); _bad_labels says what is wrong otherwise
    if _len(labels) != B:
        return False
    for i in range(B):
        y = labels[i]
        if not isinstance(y, int) or isinstance(y, bool) or y < 0 or y >= C:
            return False
    return True


def _bad_labels(labels, B, C):
    # raise the ValueError that names what is wrong with labels (_labels_ok said something is)
    try:
        n = len(labels)
    except TypeError:
        raise ValueError("CrossEntropyLoss: labels must be a list of B=%d ints in [0, %d), got %s"
                         % (B, C, type(labels).__name__))
    if n != B:
        raise ValueError("CrossEntropyLoss: labels must have B=%d entries, got %d" % (B, n))
    for i in range(B):
        y = labels[i]
        if not isinstance(y, int) or isinstance(y, bool) or y < 0 or y >= C:
            raise ValueError("CrossEntropyLoss: labels must be ints in [0, %d), got %r at index %d"
                             % (C, y, i))


class CrossEntropyLoss(Buffered):
    """Softmax cross-entropy from logits [B,C] and integer labels (B ints in [0, C))."""

    def __init__(self):
        self._grad = None

    def _allocate(self, stage, shape, other, bufs):
        self._grad = bufs.zeros("_grad", shape)

    def forward(self, logits, labels):
        check_tensor("CrossEntropyLoss", "logits", logits)
        if len(logits.shape) != 2:
            raise shape_error("CrossEntropyLoss", "logits", "[B,C]", logits.shape)
        B, C = logits.shape
        if not _labels_ok(labels, B, C):
            _bad_labels(labels, B, C)
        self._buffers("_fwd", logits.shape)
        return _check_finite("CrossEntropyLoss", self._loss(logits, labels))

    def _loss(self, logits, labels):
        # the kernel call alone: forward's frame and this one stay within the 11 words
        # MicroPython keeps off the GC heap (host/tools/frames.py)
        return backend.K.crossentropy_softmax(self._grad.data, logits.data, labels, logits.shape[0], logits.shape[1])

    def backward(self):
        if self._grad is None:
            raise RuntimeError("CrossEntropyLoss: backward() called before forward()")
        return self._grad


class MSELoss(Buffered):
    """Mean squared error over every element of pred and target (same shape)."""
    classifies = False      # train.fit: no accuracy to count

    def __init__(self):
        self._grad = None

    def _allocate(self, stage, shape, other, bufs):
        self._grad = bufs.zeros("_grad", shape)

    def forward(self, pred, target):
        check_tensor("MSELoss", "pred", pred)
        check_tensor("MSELoss", "target", target)
        if pred.shape != target.shape:
            raise shape_error("MSELoss", "target", repr(pred.shape), target.shape)
        self._buffers("_fwd", pred.shape)
        g = self._grad
        loss = backend.K.mse(g.data, pred.data, target.data, pred.size)
        return _check_finite("MSELoss", loss)

    def backward(self):
        if self._grad is None:
            raise RuntimeError("MSELoss: backward() called before forward()")
        return self._grad


def softmax_cross_entropy(logits, labels):
    """(mean loss, dlogits) for logits [B,C] and integer labels."""
    f = CrossEntropyLoss()
    loss = f.forward(logits, labels)
    return loss, f.backward()


def mse(pred, target):
    """(mean loss, dpred)."""
    f = MSELoss()
    loss = f.forward(pred, target)
    return loss, f.backward()
