# microformer.optim: SGD and Adam(W) over (param, grad) pairs; gradient clipping by global norm.
#
# A step is all or nothing. One kernel call computes the new weights and optimizer state of every
# tensor into shadow buffers (allocated once, with the optimizer) and reports a non-finite
# gradient, weight or result; the live weights and state are only read. Refused (NaN / inf):
# NonFiniteError, and nothing was written, so every weight, moment and the step counter are bit
# for bit what they were. Accepted: the new weights are copied in (params_commit) and the state
# buffers trade places: the optimizer keeps two of each state (Adam's m and v, SGD's momentum),
# the live one and the shadow, and a step's new state becomes the live one without a copy. A
# KeyboardInterrupt that lands while the commit runs makes it run again from the start (the
# shadow is complete and the trade names its side, so the commit is idempotent) and is raised
# once the step is complete ("held and honoured right after"); one that lands before drops the
# step. After a Ctrl-C the weights are those of the last full step.
from math import sqrt

from . import backend
from .finite import NonFiniteError, hyper, show
from .tensor import Tensor, zeros


def _pairs(params, who, names=None):
    # names: None, or {id(param): name} for the messages (a list of (name, param) pairs works too)
    if names is not None and not isinstance(names, dict):
        names = dict((id(p), n) for n, p in names)
    if hasattr(params, "collect_params"):
        if names is None and hasattr(params, "named_params"):
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
    for i in range(len(params)):
        if params[i][1].data is None:
            raise ValueError("%s: param %d (%s) is frozen (it has no grad buffer): pass model.parameters() "
                             "(the ones that train)" % (who, i, params[i][0].name))
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
    def __init__(self, who, params, lr, weight_decay, max_grad_norm, names=None):
        self.who = who
        self.params, self.names = _pairs(params, who, names)
        self.lr = lr
        self.weight_decay = hyper(who, "weight_decay", weight_decay, 0.0)
        self.max_grad_norm = None if max_grad_norm is None else hyper(who, "max_grad_norm",
                                                                       max_grad_norm, 0.0, None, True)
        self.steps = 0
        n = 0
        self._offsets = []
        for p, _ in self.params:
            self._offsets.append(n)
            n += p.size
        self._n = n
        self.numel = n                   # floats of the trainable parameters, end to end
        self._count = len(self.params)
        # the buffers whose sizes a step checked, 3 entries per pair (the step kernels fill it)
        self._seen = [None] * (3 * self._count)

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, v):
        # also when set later (a schedule, Session.fit(lr=...)): finite and > 0
        self._lr = hyper(self.who, "lr", v, 0.0, None, True)

    def _guard(self, slots):
        # the state and the shadow: a buffer for the new weights and two sets of one buffer per
        # state slot (each N floats, every tensor end to end), the live set and the shadow, which
        # trade places at each step; the names of what a step writes, per tensor: the weight, then
        # its state slots
        self._newp = zeros(self._n)
        self._sets = [[zeros(self._n) for _ in slots] for _ in range(2)]
        self._views = [None] * (2 * len(slots))
        self._use(0)
        self._to = 0
        what = []
        for i in range(len(self.params)):
            what.append(self.names[i])
            for name in slots:
                what.append("%s of %s" % (name, self.names[i]))
        self._what = what

    def _use(self, j):
        # set j of the state buffers is the live one, the other the shadow (idempotent)
        self._cur = j
        self._live = self._sets[j]
        self._news = self._sets[1 - j]

    def _state(self, slot):
        # the live state of `slot` as per-tensor views (made on first use, per set)
        k = 2 * slot + self._cur
        views = self._views[k]
        if views is None:
            views = []
            mv = memoryview(self._live[slot])
            for i in range(len(self.params)):
                p = self.params[i][0]
                o = self._offsets[i]
                views.append(Tensor(p.shape, mv[o:o + p.size]))
            self._views[k] = views
        return views

    def state_blocks(self):
        """The live optimizer state: one array per state slot (Adam: m, v; SGD: the momentum, if
        any), each `numel` floats, every tensor end to end in the order of `params`. A step
        replaces these arrays by the shadow ones (ask again after a step); writing into them
        (a rollback copy put back) changes the state."""
        return self._live

    def state_floats(self):
        """Floats the optimizer holds besides the weights and grads: its live state, the step's
        shadow state and the new weights (the price of an all-or-nothing step)."""
        return self._n * (1 + 2 * len(self._live))

    def snapshot_floats(self):
        """Floats the step's shadow holds (new weights and state): the price of an atomic step."""
        return self._n * (1 + len(self._news))

    def _check_live(self):
        # a parameter frozen after the optimizer was made has no grad buffer any more
        for pair in self.params:
            if pair[1].data is None:
                self._frozen()

    def _frozen(self):
        params = self.params
        for i in range(len(params)):
            if params[i][1].data is None:
                raise ValueError("%s: %s was frozen after the optimizer was made (it has no grad "
                                 "buffer): make a new optimizer for the parameters that train now"
                                 % (self.who, self.names[i]))

    def zero_grad(self):
        self._check_live()
        z = backend.K.zero
        for _, g in self.params:
            z(g.data, g.size)

    def _clip(self):
        if self.max_grad_norm is not None:
            return clip_grad_norm(self.params, self.max_grad_norm)

    def step(self):
        """One update of every parameter, all or nothing (see the top of this file)."""
        K = backend.K
        if self.max_grad_norm is not None:
            self._check_live()
            self._check_grads(K)               # before clipping scales them
            self._clip()
        t = self.steps
        bad = self._update(K, t + 1)           # the shadow only: an interrupt drops the step
        if bad != -1:
            self._refuse(K, bad)
        self._to = 1 - self._cur               # the shadow's set: live once the step commits
        self._commit(t)

    # step, _update, _commit and _write keep their frames within the interpreter's 11 words
    # (arguments, locals, value stack and try blocks): a larger frame is allocated from the heap on
    # every call. The rare paths (_held, _refuse, _check_grads) are functions of their own for that.
    def _commit(self, t):
        try:
            self.steps = t + 1
            self._write()
        except KeyboardInterrupt:           # not `as e`: that adds a hidden try block to the frame
            self._held(t)
            raise

    def _held(self, t):
        # an interrupt landed while the shadow was copied in: complete the copy; _commit then
        # honours the interrupt
        while True:
            try:
                self._write()
                break
            except KeyboardInterrupt:
                pass
        self.steps = t + 1

    def _check_grads(self, K):
        params = self.params
        for i in range(len(params)):
            g = params[i][1]
            j = K.first_nonfinite(g.data, g.size)
            if j >= 0:
                raise NonFiniteError("%s: step refused: the gradient of %s holds %s (element %d); "
                                     "weights and optimizer state are unchanged (check the inputs, "
                                     "lower lr, or set max_grad_norm)"
                                     % (self.who, self.names[i], show(g.data[j]), j))

    def _refuse(self, K, k):
        # the step kernel flagged tensor k (the first with a non-finite gradient, weight or
        # result), or a parameter without a grad buffer (k < 0: kernels.STEP_FROZEN); nothing
        # was written. Name the frozen parameter, else the first non-finite gradient of any
        # tensor, else the first of tensor k's new weight and state buffers that holds a
        # non-finite value.
        self._check_live()
        if k < 0:
            raise ValueError("%s: the step kernel answered %d for a frozen parameter, but every "
                             "parameter has a grad buffer" % (self.who, k))
        self._check_grads(K)
        o = self._offsets[k]
        n = self.params[k][0].size
        bufs = [self._newp] + self._news
        for j in range(len(bufs)):
            if K.first_nonfinite(memoryview(bufs[j])[o:o + n], n) >= 0:
                raise NonFiniteError("%s: step refused: it would make %s non-finite (lr %g); weights "
                                     "and optimizer state are unchanged (lower lr, or set "
                                     "max_grad_norm)" % (self.who, self._what[k * len(bufs) + j], self.lr))
        raise NonFiniteError("%s: step refused: %s holds a non-finite value; weights and optimizer "
                             "state are unchanged" % (self.who, self.names[k]))

    def _write(self):
        backend.K.params_commit(self.params, self._newp, self._count, self._seen)
        self._use(self._to)


class SGD(_Optimizer):
    """SGD(params, lr, momentum=0, weight_decay=0, max_grad_norm=None, names=None); momentum in
    [0, 1). names: {id(param): name} (or [(name, param)]) for the messages, when params is a list."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, max_grad_norm=None, names=None):
        _Optimizer.__init__(self, "SGD", params, lr, weight_decay, max_grad_norm, names)
        self.momentum = hyper("SGD", "momentum", momentum, 0.0, 1.0, False, True)
        self._guard(("momentum",) if self.momentum else ())
        self._hyper = [None] * 4
        self._hyper[3] = self._seen

    @property
    def buffers(self):
        """The momentum buffers after the last step, per tensor (None without momentum): views
        on the live set, which a step replaces (read it again after a step)."""
        return self._state(0) if self.momentum else None

    def _update(self, K, t):
        # the new weights (and momentum buffers) of step t into the shadow; -1 or a flagged tensor.
        # The hyperparameters go in a list kept for it: the kernel call passes five references.
        h = self._hyper
        h[0] = self._lr
        h[1] = self.momentum
        h[2] = self.weight_decay
        return K.sgd_step(self._newp, self._news, self.params, self._live, h)


class Adam(_Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, decoupled=False).

    decoupled=True is AdamW: the decay shrinks the weights directly instead of joining the gradient.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled=False, max_grad_norm=None, names=None):
        _Optimizer.__init__(self, "Adam", params, lr, weight_decay, max_grad_norm, names)
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise ValueError("Adam: betas must be two numbers in [0, 1), got %r" % (betas,))
        self.beta1 = hyper("Adam", "betas[0]", betas[0], 0.0, 1.0, False, True)
        self.beta2 = hyper("Adam", "betas[1]", betas[1], 0.0, 1.0, False, True)
        self.eps = hyper("Adam", "eps", eps, 0.0, None, True)
        self.decoupled = bool(decoupled)
        self._guard(("Adam m", "Adam v"))       # the moments of every tensor end to end
        self._hyper = [None] * 8
        self._hyper[7] = self._seen

    @property
    def m(self):
        """The first moments after the last step, per tensor: views on the live set, which a
        step replaces (read opt.m again after a step)."""
        return self._state(0)

    @property
    def v(self):
        """The second moments after the last step, per tensor (as m)."""
        return self._state(1)

    def _update(self, K, t):
        # the new weights and moments of step t into the shadow; -1 or a flagged tensor. The
        # hyperparameters go in a list kept for it: the kernel call passes five references.
        h = self._hyper
        h[0] = self._lr
        h[1] = self.beta1
        h[2] = self.beta2
        h[3] = self.eps
        h[4] = self.weight_decay
        h[5] = 1 if self.decoupled else 0
        h[6] = t
        return K.adam_step(self._newp, self._news, self.params, self._live, h)
