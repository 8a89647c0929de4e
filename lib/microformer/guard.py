# microformer.guard: a fine-tune that keeps what the model knew. Rehearsal (a replay sample of
# the base training rows mixed into the user's examples), validation after every epoch, the best
# epoch kept, a fit that leaves validation worse rolled back, divergence stopped.
#
# It works on train.fit's public hooks (on_epoch) and the model's collect_params(): it never
# reaches into the optimizer. Memory: one copy of the trainable parameters (4 bytes each, one
# block) holds the weights from before the fit until an epoch is acceptable, then the best
# acceptable epoch. The same block is what a rollback restores, so the guard costs one
# parameter-sized copy, never two.
import sys
from array import array

from .data import Batches
from .finite import NonFiniteError
from .tensor import Rng, zeros
from .train import _correct, predict_logits

REHEARSE = 4        # base training rows replayed per user example (0: none)
HOLDOUT = 0.2       # share of the user examples kept out of training for validation (rounded
HOLDOUT_MIN = 10    # down), from HOLDOUT_MIN examples on: fewer are all trained on
TOLERANCE = 0.025   # a fit may leave validation at most this much worse: accuracy points as a
                    # fraction (0.025 = one example in 40), or RMSE relative to before (regression)
DIVERGE = 10.0      # an epoch's training loss above DIVERGE x the loss before the fit: diverged
LOSS_FLOOR = 0.1    # classifiers: the start loss counts as at least this (a model that already
                    # fits its examples has a loss near 0, and any step is "10x" that)
ON_WORSE = ("rollback", "keep")
_MICRO = sys.implementation.name == "micropython"


class Diverged(Exception):
    """Raised from on_epoch to stop train.fit when the loss ran away; the guard then rolls back."""


def check(who, name, v, lo, hi, kind=float):
    """v when it is a number (an int for kind int) in [lo, hi], else ValueError naming who and name."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and lo <= v <= hi
    if kind is int:
        ok = ok and isinstance(v, int)
    if not ok:
        raise ValueError("%s: %s must be %s in [%s, %s], got %r"
                         % (who, name, "an int" if kind is int else "a number", lo, hi, v))
    return v


def rehearsal(n_base, n_user, ratio, seed):
    """Indices (sorted) of the base training rows to replay beside n_user user examples:
    min(n_base, round(ratio * n_user)) rows drawn without replacement (seeded: the same on
    every port)."""
    check("rehearsal", "ratio", ratio, 0, 1000)
    k = min(n_base, int(ratio * n_user + 0.5))
    if k <= 0:
        return []
    idx = Rng(seed).shuffle(list(range(n_base)))[:k]
    idx.sort()
    return idx


def holdout(n_user, share, seed, least=HOLDOUT_MIN):
    """(train indices, validation indices) of n_user user examples: int(share * n_user) of them,
    drawn seeded, kept for validation; none below `least` examples (each one is then worth
    more trained on than held out)."""
    check("holdout", "share", share, 0, 0.5)
    k = int(share * n_user) if n_user >= least else 0
    idx = Rng(seed).shuffle(list(range(n_user)))
    val = sorted(idx[:k])
    return sorted(idx[k:]), val


def pick(X, y, width, idx):
    """(array('f') of the rows idx of a flat [N, width] buffer X, [y[i] for i in idx])."""
    out = array("f")
    for i in idx:
        out.extend(X[i * width:(i + 1) * width])
    return out, [y[i] for i in idx]


class Score:
    """One validation: n examples, accuracy (classifiers; None for regression), loss (mean) and
    rmse (regression: sqrt of the mean MSE; None for classifiers); keep: the Score of the first
    validation set alone (what the model must keep: the base test split) when there are several,
    else None."""

    def __init__(self, n, acc, loss, rmse, keep=None):
        self.n = n
        self.acc = acc
        self.loss = loss
        self.rmse = rmse
        self.keep = keep

    def text(self):
        if self.acc is not None:
            return "accuracy %.1f%% (%d/%d)" % (100 * self.acc, round(self.acc * self.n), self.n)
        return "RMSE %.4g" % self.rmse

    def better(self, other):
        """True if this score is at least as good as `other` (None: always): accuracy, or lower
        RMSE for regression. A later epoch that ties wins: it has learned the new examples
        further."""
        if other is None:
            return True
        if self.acc is not None:
            return self.acc >= other.acc
        return self.rmse <= other.rmse

    def worse_than(self, before, tol):
        """True if what the model must keep (the first validation set; the whole set when there
        is one) is worse than in `before` by more than tol: accuracy points, or RMSE relative."""
        a = self.keep or self
        b = before.keep or before
        if a.acc is not None:
            return a.acc < b.acc - tol - 1e-9
        return a.rmse > b.rmse * (1 + tol) + 1e-12


class Guard:
    """Validation, best epoch, rollback and divergence around one train.fit.

    g = Guard(model, loss_fn, val, tol, on_worse, batch_size, restore)
    g.start(train)                    # validation before, the training loss before, the copy
    train.fit(..., on_epoch=g.on_epoch)   # raises Diverged to stop (catch it: g.diverged says so)
    g.finish()                        # puts the chosen weights in place; returns what it did

    model: what train.fit trains (forward, collect_params); loss_fn: a loss used only here (its
    buffers are kept apart from the training loss's); val: the validation Dataset, or a list of
    them: the first is what the model must keep (an epoch leaving it worse than before by more
    than tol is not acceptable), all of them together pick the best epoch (None: no validation;
    divergence is still checked); restore: a function that puts back every state from
    before the fit (weights, optimizer, lr) on a rollback; None: the guard's copy puts back the
    weights (the optimizer's moments are then those of the rolled-back fit).
    """

    def __init__(self, model, loss_fn, val, tol=TOLERANCE, on_worse="rollback", batch_size=16,
                 restore=None, diverge=DIVERGE):
        if on_worse not in ON_WORSE:
            raise ValueError("fit: on_worse must be one of %s, got %r"
                             % (", ".join(repr(v) for v in ON_WORSE), on_worse))
        check("fit", "tol", tol, 0, 1)
        check("fit", "diverge", diverge, 1, 1e30)
        self.model = model
        self.loss_fn = loss_fn
        self.tol = tol
        self.on_worse = on_worse
        self.diverge = diverge
        self.restore = restore
        self.classifies = getattr(loss_fn, "classifies", True)
        if val is not None and not isinstance(val, (list, tuple)):
            val = [val]
        # one Batches per validation set (their buffers are made once, kept for every epoch)
        self._vb = [Batches(v, batch_size) for v in (val or ()) if len(v)] or None
        self.val = val
        self._batch = batch_size
        self.params = [p for p, _ in model.collect_params([])]
        n = 0
        for p in self.params:
            n += p.size
        self.size = n
        self.copy = zeros(n)          # the one parameter-sized copy
        self.before = None
        self.best = None          # Score of the epoch in the copy (None: the copy holds `before`)
        self.best_epoch = 0
        self.last = None          # the Score of the last validated epoch
        self.validated = 0        # epochs validated (nothing per epoch is kept: a fit of any
                                  # length holds the same memory)
        self.start_loss = None
        self.diverged = None      # (epoch, loss) when the loss ran away
        self.epoch = 0

    def nbytes(self):
        """The bytes of the guard's copy of the trainable parameters."""
        return 4 * self.size

    def _keep(self):
        # copy the trainable weights into the one block
        c = self.copy
        o = 0
        for p in self.params:
            n = p.size
            c[o:o + n] = p.data
            o += n

    def _put(self):
        # from a memoryview on MicroPython (a slice of it copies nothing); CPython's array takes
        # only an array in a slice assignment
        mv = memoryview(self.copy) if _MICRO else self.copy
        o = 0
        for p in self.params:
            n = p.size
            p.data[:] = mv[o:o + n]
            o += n

    def _measure(self, batches):
        # (examples, mean loss, correct) over batches, in eval mode; a non-finite loss: inf
        total = 0.0
        correct = 0
        n = 0
        try:
            for X, y in batches:
                logits = predict_logits(self.model, X)
                total += self.loss_fn.forward(logits, y) * len(y)
                if self.classifies:
                    correct += _correct(logits, y)
                n += len(y)
        except NonFiniteError:
            return len(batches.data), float("inf"), 0
        return n, total / max(1, n), correct

    def _score(self, n, loss, correct, keep=None):
        loss /= max(1, n)
        if self.classifies:
            return Score(n, correct / max(1, n), loss, None, keep)
        return Score(n, None, loss, loss ** 0.5, keep)

    def validate(self):
        """The Score of the model as it is now on the validation sets (None without one)."""
        if self._vb is None:
            return None
        n = 0
        loss = 0.0
        correct = 0
        keep = None
        for b in self._vb:
            k, l, c = self._measure(b)
            n += k
            loss += l * k
            correct += c
            if keep is None and len(self._vb) > 1:
                keep = self._score(k, l * k, c)
        return self._score(n, loss, correct, keep)

    def start(self, train):
        """Before the first step: validation, the training loss (divergence's yardstick) and
        the copy of the weights. Returns the validation Score (None without validation)."""
        self.before = self.validate()
        n, loss, _ = self._measure(Batches(train, self._batch))
        self.start_loss = loss
        self._keep()
        return self.before

    def limit(self):
        """The training loss above which an epoch counts as diverged."""
        s = self.start_loss
        if self.classifies and s < LOSS_FLOOR:
            s = LOSS_FLOOR
        return self.diverge * s

    def on_epoch(self, rec):
        """train.fit's on_epoch: divergence check, validation, best epoch."""
        self.epoch = rec["epoch"]
        loss = rec["loss"]
        if not (loss == loss and loss <= self.limit()) and rec["steps"]:
            self.diverged = (self.epoch, loss)
            raise Diverged("epoch %d: loss %.4g, over %gx the %.4g before the fit"
                           % (self.epoch, loss, self.diverge, self.start_loss))
        sc = self.validate()
        if sc is None:
            return
        self.last = sc
        self.validated += 1
        if self.on_worse == "rollback" and sc.worse_than(self.before, self.tol):
            return                 # not acceptable: the copy keeps what it holds
        if sc.better(self.best):
            self.best = sc
            self.best_epoch = self.epoch
            self._keep()

    def _rollback(self):
        if self.restore is not None:
            self.restore()
        else:
            self._put()

    def finish(self):
        """Puts the chosen weights in place and returns (what, text): what is 'best' (the best
        epoch's weights, text names it), 'last' (no validation: the last epoch's weights stay),
        'rollback' (diverged, or every epoch worse than before by more than tol: the state from
        before the fit) or 'none' (no epoch ran)."""
        if self.diverged is not None:
            self._rollback()
            e, loss = self.diverged
            return "rollback", ("diverged at epoch %d: training loss %.4g, over %gx the %.4g before "
                                "the fit" % (e, loss, self.diverge, self.start_loss))
        if self.before is None:
            return "last", "no validation set: the last epoch's weights stay"
        if not self.validated:
            return "none", "no epoch was validated"
        if self.best is None:
            self._rollback()
            last = self.last
            return "rollback", ("every epoch left validation worse than before the fit by more than "
                                "the tolerance of %s (before: %s; last epoch: %s)"
                                % (self.tol_text(), self.before.text(), last.text()))
        self._put()
        worse = self.best.worse_than(self.before, self.tol)
        return "best", ("kept epoch %d of %d: validation %s (before the fit: %s%s)"
                        % (self.best_epoch, self.epoch, self.best.text(), self.before.text(),
                           "; worse by more than %s, kept: on_worse='keep'" % self.tol_text()
                           if worse else ""))

    def tol_text(self):
        """The tolerance in words (accuracy points, or RMSE relative to before)."""
        if self.classifies:
            return "%.1f points" % (100 * self.tol)
        return "%g%% RMSE" % (100 * self.tol)
