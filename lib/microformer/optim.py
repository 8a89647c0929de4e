# microformer.optim: SGD and Adam(W) over (param, grad) pairs; gradient clipping by global norm.
from math import sqrt

from . import backend
from .tensor import Tensor


def _pairs(params, who):
    if hasattr(params, "collect_params"):
        params = params.collect_params([])
    params = list(params)
    for p in params:
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], Tensor)
                and isinstance(p[1], Tensor) and p[0].shape == p[1].shape):
            raise ValueError("%s: params must be a model or (param, grad) Tensor pairs of equal shape, got %r"
                             % (who, p))
    return params


def _positive(who, what, v, allow_zero=True):
    if not isinstance(v, (int, float)) or v != v or v < 0 or (v == 0 and not allow_zero):
        raise ValueError("%s: %s must be a %s number, got %r"
                         % (who, what, "non-negative" if allow_zero else "positive", v))
    return float(v)


def clip_grad_norm(params, max_norm):
    """Scale every grad so their global L2 norm is at most max_norm; return the norm before."""
    K = backend.K
    total = 0.0
    for _, g in params:
        total += K.sum_squares(g.data, g.size)
    norm = sqrt(total)
    if norm > max_norm and norm > 0.0:
        f = max_norm / norm
        for _, g in params:
            K.scale_inplace(g.data, g.size, f)
    return norm


class _Optimizer:
    def __init__(self, who, params, lr, weight_decay, max_grad_norm):
        self.params = _pairs(params, who)
        self.lr = _positive(who, "lr", lr, False)
        self.weight_decay = _positive(who, "weight_decay", weight_decay)
        self.max_grad_norm = None if max_grad_norm is None else _positive(who, "max_grad_norm",
                                                                           max_grad_norm, False)
        self.steps = 0

    def zero_grad(self):
        z = backend.K.zero
        for _, g in self.params:
            z(g.data, g.size)

    def _clip(self):
        if self.max_grad_norm is not None:
            return clip_grad_norm(self.params, self.max_grad_norm)


class SGD(_Optimizer):
    """SGD(params, lr, momentum=0, weight_decay=0, max_grad_norm=None)."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, max_grad_norm=None):
        _Optimizer.__init__(self, "SGD", params, lr, weight_decay, max_grad_norm)
        self.momentum = _positive("SGD", "momentum", momentum)
        self.buffers = [Tensor.zeros(p.shape) for p, _ in self.params] if self.momentum else None

    def step(self):
        self._clip()
        self.steps += 1
        K = backend.K
        params = self.params
        for i in range(len(params)):     # (no enumerate: its tuples would be garbage every step)
            p, g = params[i]
            K.sgd_update(p.data, g.data, self.buffers[i].data if self.buffers else None,
                         p.size, self.lr, self.momentum, self.weight_decay)


class Adam(_Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, decoupled=False).

    decoupled=True is AdamW: the decay shrinks the weights directly instead of joining the gradient.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled=False, max_grad_norm=None):
        _Optimizer.__init__(self, "Adam", params, lr, weight_decay, max_grad_norm)
        if len(betas) != 2 or not (0.0 <= betas[0] < 1.0) or not (0.0 <= betas[1] < 1.0):
            raise ValueError("Adam: betas must be two numbers in [0, 1), got %r" % (betas,))
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = _positive("Adam", "eps", eps, False)
        self.decoupled = bool(decoupled)
        self.m = [Tensor.zeros(p.shape) for p, _ in self.params]
        self.v = [Tensor.zeros(p.shape) for p, _ in self.params]

    def step(self):
        self._clip()
        self.steps += 1
        t = self.steps
        bc1 = 1.0 - self.beta1 ** t
        bc2 = 1.0 - self.beta2 ** t
        K = backend.K
        params = self.params
        for i in range(len(params)):
            p, g = params[i]
            K.adam_update(p.data, g.data, self.m[i].data, self.v[i].data, p.size, self.lr,
                          self.beta1, self.beta2, self.eps, self.weight_decay, bc1, bc2,
                          1 if self.decoupled else 0)
