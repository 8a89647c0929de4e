# microformer.optim: SGD and Adam(W) over (param, grad) pairs; gradient clipping by global norm.
# SGD, clip_grad_norm, the dry run and the refusals' messages live in optrare.py, imported on
# first use (microformer.optim.SGD and .clip_grad_norm name them).
#
# Memory: the optimizer state is one block per state slot (Adam's m and v, SGD's momentum), every
# tensor end to end, and a scratch for the new weights and state of a group of consecutive tensors
# at a time (GROUP floats; a larger tensor in pieces): numel * slots + (1 + slots) * scratch_stretch
# floats, where an all-or-nothing step over shadow copies of the whole model would take
# numel * (1 + 2 * slots).
#
# A step is all or nothing. First it makes sure that no value it would write is NaN or inf: a
# bound from the sums of squares of the gradients, weights and state proves it cheaply (every
# value finite and far from the float range's end); when the bound cannot (huge or non-finite
# values), a dry run computes each tensor's new weight and state into the scratch and checks them.
# Refused (NaN / inf): NonFiniteError, and nothing was written, so every weight, moment and the
# step counter are bit for bit what they were. Accepted: the commit updates one group of tensors
# at a time, into the scratch, then copied over the live weights and state. A KeyboardInterrupt
# that lands before the commit drops the step; one that lands during it makes the commit go on
# from where it stopped (the live values of a group change only by the copy of its finished
# scratch, and `_at` names the stage: even 2k, group k's update into the scratch, which reads
# only live values that have not changed; odd 2k + 1, its copy, which can run again) and is raised once the
# step is complete ("held and honoured right after"). After a Ctrl-C the weights are those of the
# last full step.
from math import frexp

from . import backend
from .layer import _epoch
from .finite import NonFiniteError, hyper, show
from .lazy import adopt, sibling, stub
from .tensor import Tensor, has_grad, zeros

# The bound (see _Optimizer._bounded): from the largest exponent field of the gradients, weights
# and state (kernels.max_exponent: every |x| is below 2^(e - 126)), limits that keep every
# intermediate and result of the update below 2^101 (float32 goes to 2^128; the viper kernels'
# rounding, a relative 2^-11, is far inside that margin). Integers only: a step boxes no float.
_P_LIM = 226                # |p| < 2^100
_V_LIM = 246                # |v| < 2^120 (v' <= max(v, d^2) < 2^120)
_D_LOG = 60                 # |d| (the gradient with its coupled decay) and |m'| below 2^60


# The scratch holds the new weights and state of a group of consecutive pieces of tensors (one
# kernel call and one copy per group, not per tensor): GROUP floats (the total when smaller). A
# tensor larger than GROUP is updated in pieces of at most GROUP floats (views on its weight and
# gradient, _Piece): the update is elementwise, so the pieces give the same values as the whole.
# 1024: the scratch is 12 KB with Adam whatever the model (4096 held 48 KB, a quarter of a LoRA
# fine-tune's trainable state), for about 5 % more instructions per parameter on large tensors
# (the calls per piece; host/bench/bench_native.py adam_per_param on two Dense(128, 128)).
GROUP = 1024


def scratch_stretch(sizes):
    """Floats per slot of the step's scratch for tensors of these sizes (model.summary and the
    memory plan count it with this): GROUP, or the total when smaller."""
    n = 0
    for k in sizes:
        n += k
    return min(n, GROUP)


class _Piece:
    """Floats a .. a + size of a weight or gradient Tensor, as the step kernels read a Tensor:
    `.data` is a view on the source's current data (made again when the source's array is
    another one: a gradient made on first use, dropped by a freeze, made again), None when the
    source has none (a frozen gradient: the kernel answers STEP_FROZEN)."""

    def __init__(self, src, a, n):
        self.src = src
        self.a = a
        self.size = n
        self.shape = (n,)
        self._of = None
        self._v = None

    @property
    def data(self):
        d = self.src.data
        if d is not self._of:
            self._v = None if d is None else memoryview(d)[self.a:self.a + self.size]
            self._of = d
        return self._v


def _exp2(x):
    # k with x < 2^k for x > 0 (math.frexp: x = f 2^k, f in [0.5, 1))
    return frexp(x)[1]

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
        if not has_grad(params[i][1]):
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


def _state_copy(K, live, new):
    # each live state view = its scratch view (a function of its own: a small frame)
    j = len(live)
    while j:
        j -= 1
        K.copy(live[j], new[j], len(new[j]))


def _rare():
    # optrare, imported now if it is not yet; its functions become _Optimizer's methods
    m = sibling("optrare", "the optimizer")
    return adopt(_Optimizer, m, m.METHODS)


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
        self._big = scratch_stretch([p.size for p, _ in self.params])   # the scratch's floats per slot
        self.numel = n                   # floats of the trainable parameters, end to end
        self._count = len(self.params)
        self._at = 0                     # the commit's stage (see the top of this file)
        self._live_at = -1               # layer._epoch when every parameter last had a grad

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, v):
        # also when set later (a schedule, Session.fit(lr=...)): finite and > 0
        self._lr = hyper(self.who, "lr", v, 0.0, None, True)

    def _guard(self, slots):
        # the state: one block per state slot (numel floats, every tensor end to end) and its
        # per-tensor views; the scratch: _big floats for the new weights and again per slot. The
        # tensors in groups of consecutive ones that fit the scratch; per group, what its kernel
        # call takes (made once: a step allocates no lists): its pairs, the live state views of
        # its stretch, the scratch's views of its size (weights, state), the record of checked
        # sizes, its tensor count.
        n = self._n
        big = self._big
        self._blocks = [zeros(n) for _ in slots]
        self._scratch = [zeros(big) for _ in range(1 + len(slots))]
        self._views = [None] * len(slots)     # per-tensor views of each block, made on first use
        self._pc = []                    # per group: its pieces, [tensor index, offset in the group]
        self._one = []
        self._lv = []
        self._sp = []
        self._sv = []
        self._seenk = []
        self._gn = []
        sm = [memoryview(b) for b in self._scratch]
        pieces = []                          # (tensor index, first float, floats), end to end
        for i in range(self._count):
            s = self.params[i][0].size
            a = 0
            while a < s:
                n = min(big, s - a)
                pieces.append((i, a, n))
                a += n
        k = 0
        while k < len(pieces):
            pairs = []
            pc = []
            o = self._offsets[pieces[k][0]] + pieces[k][1]
            size = 0
            while k < len(pieces) and size + pieces[k][2] <= big:
                i, a, n = pieces[k]
                pair = self.params[i]
                if n != pair[0].size:
                    pair = (_Piece(pair[0], a, n), _Piece(pair[1], a, n))
                pairs.append(pair)
                pc.append([i, size])
                size += n
                k += 1
            self._pc.append(pc)
            self._one.append(pairs)
            self._lv.append([memoryview(b)[o:o + size] for b in self._blocks])
            self._sp.append(sm[0][:size])
            self._sv.append([sm[j + 1][:size] for j in range(len(slots))])
            self._seenk.append([None] * (3 * len(pairs)))
            self._gn.append(len(pairs))
        self._groups = len(self._pc)
        self._slots = slots                  # their names, for _refuse's message

    def _state(self, j):
        # per-tensor Tensor views on state block j (made on first use: opt.m, opt.v, opt.buffers)
        views = self._views[j]
        if views is None:
            views = []
            mv = memoryview(self._blocks[j])
            for i in range(self._count):
                p = self.params[i][0]
                o = self._offsets[i]
                views.append(Tensor(p.shape, mv[o:o + p.size]))
            self._views[j] = views
        return views

    def state_blocks(self):
        """The optimizer state: one array per state slot (Adam: m, v; SGD: the momentum, if any),
        each `numel` floats, every tensor end to end in the order of `params`. The same arrays for
        the optimizer's life; writing into them (a rollback copy put back) changes the state."""
        return self._blocks

    def state_floats(self):
        """Floats the optimizer holds besides the weights and grads: its state blocks and the
        scratch for one tensor's new weight and state (the price of an all-or-nothing step)."""
        return self._n * len(self._blocks) + self.snapshot_floats()

    def snapshot_floats(self):
        """Floats of the step's scratch (a group of tensors' new weights and state): the price of
        an all-or-nothing step."""
        return self._big * len(self._scratch)

    def _check_live(self):
        # a parameter frozen after the optimizer was made has no grad buffer any more
        for pair in self.params:
            if not has_grad(pair[1]):
                self._frozen()

    # ---- optrare.py (loaded on first use: a step that goes through never runs them; its
    # functions replace these stubs on the class then): the dry run, the refusals' messages
    _frozen = stub(_rare, "_frozen")
    _broken = stub(_rare, "_broken")
    _dry = stub(_rare, "_dry")
    _refuse = stub(_rare, "_refuse")

    def zero_grad(self):
        self._check_live()
        z = backend.K.zero
        for _, g in self.params:
            z(g.data, g.size)

    def _clip(self):
        if self.max_grad_norm is not None:
            return _rare().clip_grad_norm(self.params, self.max_grad_norm)

    def step(self):
        """One update of every parameter, all or nothing (see the top of this file)."""
        K = backend.K
        if self._live_at != _epoch[0]:         # a freeze since the last check: check again
            self._check_live()
            self._live_at = _epoch[0]
        if self.max_grad_norm is not None:
            self._check_grads(K)               # before clipping scales them
            self._clip()
        t = self.steps + 1
        self._set(t)
        if not self._bounded(K):
            bad = self._dry(K)                 # the scratch only: an interrupt drops the step
            if bad != -1:
                self._refuse(K, bad)
        self._at = 0                           # before the try: an interrupt here drops the step
        self._commit(t)

    # step, _commit, _run and the kernel calls keep their frames within the interpreter's 11 words
    # (arguments, locals, value stack and try blocks): a larger frame is allocated from the heap on
    # every call. The rare paths (_held, _refuse, _check_grads, _dry) are functions of their own.
    def _commit(self, t):
        try:
            self._run()
            self.steps = t
        except KeyboardInterrupt:           # not `as e`: that adds a hidden try block to the frame
            self._held(t)
            raise

    def _run(self):
        # from stage _at to the end: group k's update into the scratch (stage 2k), its copy over
        # the live weights and state (2k + 1); _at moves on only once a stage is complete
        K = backend.K
        end = 2 * self._groups
        at = self._at
        while at < end:
            if at & 1:
                self._copy(K, at >> 1)
            elif self._update(K, at >> 1) != -1:
                self._broken(at >> 1)
            at += 1
            self._at = at

    def _copy(self, K, k):
        K.params_commit(self._one[k], self._sp[k], self._gn[k], self._seenk[k])
        _state_copy(K, self._lv[k], self._sv[k])

    def _held(self, t):
        # an interrupt landed during the commit: go on from the stage it stopped at; _commit then
        # honours the interrupt
        while True:
            try:
                self._run()
                break
            except KeyboardInterrupt:
                pass
        self.steps = t

    def _within(self, K, lg, lp):
        # every gradient's exponent field at most lg, every weight's at most lp
        return K.max_exponent_pairs(self.params, 1) <= lg and K.max_exponent_pairs(self.params, 0) <= lp

    def _limit(self, lim):
        # (lg, lp): the exponent-field limits of gradients and weights for |d| < 2^b (lim[0] = b)
        # with d = g + wd p (+ momentum buf): each term below 2^(b - lim[1])
        b = lim[0] - lim[1]
        lp = _P_LIM
        if self.weight_decay and not getattr(self, "decoupled", False):
            lp = min(lp, 126 + b - _exp2(self.weight_decay))
        return 126 + b, lp

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
        self._lims = [None] * 9

    @property
    def m(self):
        """The first moments, per tensor: views on the m block."""
        return self._state(0)

    @property
    def v(self):
        """The second moments, per tensor: views on the v block."""
        return self._state(1)

    def _set(self, t):
        # the hyperparameters of step t, in the list the kernel calls take (five references)
        h = self._hyper
        h[0] = self._lr
        h[1] = self.beta1
        h[2] = self.beta2
        h[3] = self.eps
        h[4] = self.weight_decay
        h[5] = 1 if self.decoupled else 0
        h[6] = t

    def _bounded(self, K):
        # True when every value is finite and small enough that no update can overflow:
        # |d| <= |g| + wd |p| < 2^b (each term below 2^(b - 1)), |m| < 2^b, so |m'| < 2^b, and
        # the step, at most lr |m'| / (bc1 eps) with bc1 >= 1 - beta1, is below 2^100 when
        # 2^b lr / ((1 - beta1) eps) <= 2^100, b <= _D_LOG; v' <= max(v, d^2) < 2^120
        lim = self._limits()
        if not self._within(K, lim[2], lim[3]):
            return False
        f = K.max_exponent
        return f(self._blocks[0], self._n) <= 126 + lim[0] and f(self._blocks[1], self._n) <= _V_LIM

    def _limits(self):
        # [b, 1, lg, lp] for the current hyperparameters: made again only when one is another
        # object than last time (no float is boxed by a step that changes none)
        L = self._lims
        if not (L[4] is self._lr and L[5] is self.weight_decay and L[6] is self.eps
                and L[7] is self.beta1 and L[8] is self.decoupled):
            # lr / ((1 - beta1) eps) < 2^(a - c - e + 2) for lr < 2^a, 1 - beta1 >= 2^(c - 1),
            # eps >= 2^(e - 1): integers, so no quotient overflows
            L[0] = min(_D_LOG, 100 - (_exp2(self._lr) - _exp2(1.0 - self.beta1) - _exp2(self.eps) + 2))
            L[1] = 1
            L[2], L[3] = self._limit(L)
            L[4] = self._lr
            L[5] = self.weight_decay
            L[6] = self.eps
            L[7] = self.beta1
            L[8] = self.decoupled
        return L

    def _update(self, K, k):
        # group k's new weights and moments into the scratch; -1, a flagged tensor of the group
        # (its index there) or STEP_FROZEN
        h = self._hyper
        h[7] = self._seenk[k]
        return K.adam_step(self._sp[k], self._sv[k], self._one[k], self._lv[k], h)


def __getattr__(name):
    # SGD and clip_grad_norm live in optrare.py (imported on first use)
    if name == "SGD" or name == "clip_grad_norm":
        return getattr(_rare(), name)
    raise AttributeError("module 'microformer.optim' has no attribute '%s'" % name)
