# microformer.optrare: the optimizer code an Adam step that goes through never runs, imported on
# first use (a board's heap is small): SGD, clip_grad_norm (max_grad_norm), the dry run a step
# makes when the cheap bound cannot prove it finite (_dry), and the refusals' messages (_refuse,
# _frozen, _broken). optim.py names SGD and clip_grad_norm (microformer.optim.SGD is this SGD)
# and binds every name in METHODS to its _Optimizer on first use; each of those functions takes
# the optimizer as its first argument. optim.py's header says what a step does.
from math import sqrt

from . import backend
from .finite import NonFiniteError, hyper
from .optim import _D_LOG, _Optimizer, _exp2
from .tensor import has_grad

METHODS = ("_frozen", "_broken", "_dry", "_refuse")


def clip_grad_norm(params, max_norm):
    """Scale every grad so their global L2 norm is at most max_norm; return the norm before."""
    K = backend.K
    total = 0.0
    for _, g in params:
        total += K.sum_squares(g.data, g.size)
    norm = sqrt(total)
    if norm - norm != 0.0:
        norm = _scaled_norm(params)
    if norm > max_norm and norm > 0.0:
        f = max_norm / norm
        for _, g in params:
            K.scale_inplace(g.data, g.size, f)
    return norm


def _scaled_norm(params):
    # the global norm of finite grads whose squares overflow a float (single-precision ports):
    # computed on grads divided by the largest |g|, which stays finite
    amax = 0.0
    for _, g in params:
        for x in g.data:
            if abs(x) > amax:
                amax = abs(x)
    if amax - amax != 0.0:
        return amax                     # a non-finite grad: the step refuses it
    total = 0.0
    for _, g in params:
        for x in g.data:
            x = x / amax
            total += x * x
    return amax * sqrt(total)


def _frozen(self):
    params = self.params
    for i in range(len(params)):
        if not has_grad(params[i][1]):
            raise ValueError("%s: %s was frozen after the optimizer was made (it has no grad "
                             "buffer): make a new optimizer for the parameters that train now"
                             % (self.who, self.names[i]))


def _broken(self, k):
    raise RuntimeError("%s: the update of %s turned non-finite during the commit after the "
                       "check passed (a parameter listed twice?)" % (self.who, self.names[self._pc[k][0][0]]))


def _dry(self, K):
    # every group's update into the scratch, checked: -1, kernels.STEP_FROZEN, or the first
    # flagged piece as [group, piece in the group] (its group's results in the scratch)
    for g in range(self._groups):
        bad = self._update(K, g)
        if bad != -1:
            return [g, bad] if bad >= 0 else bad
    return -1


def _refuse(self, K, k):
    # the dry run flagged piece k = [group, piece] (the first with a non-finite gradient,
    # weight or result; its group's results are in the scratch), or a parameter without a
    # grad buffer (k < 0: kernels.STEP_FROZEN); nothing was written. Name the frozen
    # parameter, else the first non-finite gradient of any tensor, else the first of the
    # piece's new weight and state that holds a non-finite value (named by its tensor).
    self._check_live()
    if not isinstance(k, list):
        raise ValueError("%s: the step kernel answered %d for a frozen parameter, but every "
                         "parameter has a grad buffer" % (self.who, k))
    self._check_grads(K)
    g, j = k
    n = self._one[g][j][0].size
    k, o = self._pc[g][j]
    bufs = [self._sp[g][o:o + n]] + [b[o:o + n] for b in self._sv[g]]
    for j in range(len(bufs)):
        if K.first_nonfinite(bufs[j], n) >= 0:
            what = self.names[k] if j == 0 else "%s of %s" % (self._slots[j - 1], self.names[k])
            raise NonFiniteError("%s: step refused: it would make %s non-finite (lr %g); weights "
                                 "and optimizer state are unchanged (lower lr, or set "
                                 "max_grad_norm)" % (self.who, what, self.lr))
    raise NonFiniteError("%s: step refused: %s holds a non-finite value; weights and optimizer "
                         "state are unchanged" % (self.who, self.names[k]))


class SGD(_Optimizer):
    """SGD(params, lr, momentum=0, weight_decay=0, max_grad_norm=None, names=None); momentum in
    [0, 1). names: {id(param): name} (or [(name, param)]) for the messages, when params is a list."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, max_grad_norm=None, names=None):
        _Optimizer.__init__(self, "SGD", params, lr, weight_decay, max_grad_norm, names)
        self.momentum = hyper("SGD", "momentum", momentum, 0.0, 1.0, False, True)
        self._guard(("momentum",) if self.momentum else ())
        self._hyper = [None] * 4
        self._lims = [None] * 6

    @property
    def buffers(self):
        """The momentum buffers, per tensor (None without momentum): views on the state block."""
        return self._state(0) if self.momentum else None

    def _set(self, t):
        # the hyperparameters of step t, in the list the kernel calls take (five references)
        h = self._hyper
        h[0] = self._lr
        h[1] = self.momentum
        h[2] = self.weight_decay

    def _bounded(self, K):
        # True when every value is finite and small enough that no update can overflow:
        # |d| <= |g| + wd |p| + momentum |buf| < 3 2^(b - 2) with 2^b lr <= 2^100, b <= _D_LOG
        # (each term below 2^(b - 2)), so the new buffer d and p' = p - lr d stay below 2^101
        lim = self._limits()
        if not self._within(K, lim[2], lim[3]):
            return False
        return not self.momentum or K.max_exponent(self._blocks[0], self._n) <= lim[2]

    def _limits(self):
        # [b, 2, lg, lp] for the current lr and weight decay: made again only when one is another
        # object than last time (no float is boxed by a step that changes neither)
        L = self._lims
        if not (L[4] is self._lr and L[5] is self.weight_decay):
            L[0] = min(_D_LOG, 100 - _exp2(self._lr))
            L[1] = 2
            L[2], L[3] = self._limit(L)
            L[4] = self._lr
            L[5] = self.weight_decay
        return L

    def _update(self, K, k):
        # group k's new weights (and momentum) into the scratch; -1, a flagged tensor of the
        # group (its index there) or STEP_FROZEN
        h = self._hyper
        h[3] = self._seenk[k]
        return K.sgd_step(self._sp[k], self._sv[k], self._one[k], self._lv[k], h)
