# microformer.optim: SGD and Adam(W) over (param, grad) pairs; gradient clipping by global norm.
#
# A step is all or nothing. Before anything is written the gradients are checked (NaN / inf:
# NonFiniteError); then the weights and moments are copied into a snapshot (buffers allocated
# once, with the optimizer), updated, and scanned: a non-finite weight or moment puts the
# snapshot back and raises NonFiniteError, so every weight, moment and the step counter are bit
# for bit what they were. A KeyboardInterrupt that lands while the weights are being written
# puts the snapshot back, runs the whole update again, and is raised once the step is complete
# ("held and honoured right after"): after a Ctrl-C the weights are those of the last full step.
from math import sqrt

from . import backend
from .finite import NonFiniteError, hyper, show
from .tensor import Tensor


def _pairs(params, who):
    names = None
    if hasattr(params, "collect_params"):
        if hasattr(params, "named_params"):
            names = {}
            for name, p in params.named_params():
                names[id(p)] = name
        params = params.collect_params([])
    params = list(params)
    for p in params:
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], Tensor)
                and isinstance(p[1], Tensor) and p[0].shape == p[1].shape):
            raise ValueError("%s: params must be a model or (param, grad) Tensor pairs of equal shape, got %r"
                             % (who, p))
    out = []
    for i in range(len(params)):
        p = params[i][0]
        if names and id(p) in names:
            out.append(names[id(p)])
        else:
            out.append("param %d%s" % (i, " (%s)" % p.name if p.name else ""))
    return params, out


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


class _Optimizer:
    def __init__(self, who, params, lr, weight_decay, max_grad_norm):
        self.who = who
        self.params, self.names = _pairs(params, who)
        self.lr = lr
        self.weight_decay = hyper(who, "weight_decay", weight_decay, 0.0)
        self.max_grad_norm = None if max_grad_norm is None else hyper(who, "max_grad_norm",
                                                                       max_grad_norm, 0.0, None, True)
        self.steps = 0
        self._held = False
        self._dirty = False

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, v):
        # also when set later (a schedule, Session.fit(lr=...)): finite and > 0
        self._lr = hyper(self.who, "lr", v, 0.0, None, True)

    def _guard(self, moments):
        # the tensors a step writes (each weight, then its moments) and their snapshot buffers
        state = []
        what = []
        for i in range(len(self.params)):
            state.append(self.params[i][0])
            what.append(self.names[i])
            for name, m in moments:
                state.append(m[i])
                what.append("%s of %s" % (name, self.names[i]))
        self._state = state
        self._what = what
        self._saved = [Tensor.zeros(t.shape) for t in state]

    def snapshot_floats(self):
        """Floats the step's snapshot holds (weights and moments): the price of an atomic step."""
        n = 0
        for t in self._saved:
            n += t.size
        return n

    def zero_grad(self):
        z = backend.K.zero
        for _, g in self.params:
            z(g.data, g.size)

    def _clip(self):
        if self.max_grad_norm is not None:
            return clip_grad_norm(self.params, self.max_grad_norm)

    def step(self):
        """One update of every parameter, all or nothing (see the top of this file)."""
        K = backend.K
        params = self.params
        for i in range(len(params)):           # nothing is written before this check
            g = params[i][1]
            j = K.first_nonfinite(g.data, g.size)
            if j >= 0:
                raise NonFiniteError("%s: step refused: the gradient of %s holds %s (element %d); "
                                     "weights and optimizer state are unchanged (check the inputs, "
                                     "lower lr, or set max_grad_norm)"
                                     % (self.who, self.names[i], show(g.data[j]), j))
        self._clip()
        state = self._state
        saved = self._saved
        for i in range(len(state)):            # an interrupt here leaves the weights as they were
            K.copy(saved[i].data, state[i].data, state[i].size)
        self._held = False
        self._dirty = False
        bad = self._apply(K, self.steps)
        if bad >= 0:
            self._held = False
            raise NonFiniteError("%s: step refused: it would make %s non-finite (lr %g); weights and "
                                 "optimizer state are unchanged (lower lr, or set max_grad_norm)"
                                 % (self.who, self._what[bad], self.lr))
        if self._held:
            self._held = False
            raise KeyboardInterrupt

    def _apply(self, K, t):
        # Update from the snapshot until one run completes; an interrupt restarts it (recursion
        # from inside the handler: another interrupt is caught by the inner call). Returns the
        # index of a state tensor the update made non-finite (then put back), or -1.
        try:
            if self._dirty:
                self._restore(K, t)
            self._dirty = True
            self.steps = t + 1
            self._update(K, t + 1)
            bad = -1
            state = self._state
            for i in range(len(state)):
                if K.first_nonfinite(state[i].data, state[i].size) >= 0:
                    bad = i
                    break
            if bad >= 0:
                self._restore(K, t)
            self._dirty = False
            return bad
        except KeyboardInterrupt:
            self._held = True
            return self._apply(K, t)
        except Exception:
            # e.g. MemoryError in the middle of the update: put the weights back, then report
            self._restore(K, t)
            raise

    def _restore(self, K, t):
        state = self._state
        saved = self._saved
        for i in range(len(state)):
            K.copy(state[i].data, saved[i].data, state[i].size)
        self.steps = t
        self._dirty = False


class SGD(_Optimizer):
    """SGD(params, lr, momentum=0, weight_decay=0, max_grad_norm=None); momentum in [0, 1)."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, max_grad_norm=None):
        _Optimizer.__init__(self, "SGD", params, lr, weight_decay, max_grad_norm)
        self.momentum = hyper("SGD", "momentum", momentum, 0.0, 1.0, False, True)
        self.buffers = [Tensor.zeros(p.shape) for p, _ in self.params] if self.momentum else None
        self._guard((("momentum",  self.buffers),) if self.buffers else ())

    def _update(self, K, t):
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
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise ValueError("Adam: betas must be two numbers in [0, 1), got %r" % (betas,))
        self.beta1 = hyper("Adam", "betas[0]", betas[0], 0.0, 1.0, False, True)
        self.beta2 = hyper("Adam", "betas[1]", betas[1], 0.0, 1.0, False, True)
        self.eps = hyper("Adam", "eps", eps, 0.0, None, True)
        self.decoupled = bool(decoupled)
        self.m = [Tensor.zeros(p.shape) for p, _ in self.params]
        self.v = [Tensor.zeros(p.shape) for p, _ in self.params]
        self._guard((("Adam m", self.m), ("Adam v", self.v)))

    def _update(self, K, t):
        bc1 = 1.0 - self.beta1 ** t
        bc2 = 1.0 - self.beta2 ** t
        params = self.params
        for i in range(len(params)):
            p, g = params[i]
            K.adam_update(p.data, g.data, self.m[i].data, self.v[i].data, p.size, self.lr,
                          self.beta1, self.beta2, self.eps, self.weight_decay, bc1, bc2,
                          1 if self.decoupled else 0)
