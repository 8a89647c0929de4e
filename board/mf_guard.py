# mf_guard.py: the session's side of microformer.guard, imported by Session.fit on first use.
# A fit on the user's examples replays a sample of the base training rows beside them, validates
# on the base test split plus a share of the user's examples after every epoch, keeps the best
# epoch and rolls back a fit that leaves validation worse (or that diverges).
from microformer import guard as _g
from mf_examples import _n

Diverged = _g.Diverged


def check(on_worse, rehearse, tol):
    """fit's guard arguments, checked before anything changes; returns (rehearse, tol)."""
    if on_worse not in _g.ON_WORSE:
        raise ValueError("fit: on_worse must be one of %s, got %r"
                         % (", ".join(repr(v) for v in _g.ON_WORSE), on_worse))
    if rehearse is None:
        rehearse = _g.REHEARSE
    if tol is None:
        tol = _g.TOLERANCE
    _g.check("fit", "rehearse (base rows replayed per user example)", rehearse, 0, 1000)
    _g.check("fit", "tol", tol, 0, 1)
    return rehearse, tol


def plan(data, name, ds, why, rehearse, seed, width, raw, has_base, standardized, select):
    """(training set, validation sets, why) for a fit: unchanged (no validation) unless the fit
    is on the user's examples (data None picking them, or 'user'); then the user's examples
    less a held-out share, plus `rehearse` base training rows per example, and for validation
    the base test split plus the held-out examples. The session's data come through its calls:
    raw(selection) -> (flat raw rows of `width` numbers, labels), standardized(X, y) -> a data
    set, select(name, who) -> (name, data set); has_base: whether it has base data."""
    if name != "user" or not (data is None or data == "user"):
        return ds, None, why
    uX, uy = raw("user")
    n = width
    keep, held = _g.holdout(len(uy), _g.HOLDOUT, seed)
    X, y = _g.pick(uX, uy, n, keep)
    replay = []
    base = has_base
    if base and rehearse:
        bX, by = raw("train")
        replay = _g.rehearsal(len(by), len(keep), rehearse, seed)
        rX, ry = _g.pick(bX, by, n, replay)
        X.extend(rX)
        y = y + ry
        bX = by = rX = ry = None
    train = standardized(X, y)
    X = y = None
    val = []
    test = 0
    if base:
        try:
            val.append(select("test", "fit")[1])
            test = len(val[0])
        except ValueError:          # every base row is 'train'
            pass
    # the user's examples in validation: the held-out ones, or (too few to hold any out) all of
    # them, trained on: the best epoch is then the one that learned them while keeping the base
    vX, vy = _g.pick(uX, uy, n, held) if held else (uX, uy)
    val.append(standardized(vX, vy))
    vX = vy = None
    parts = [why]
    if replay:
        parts.append("%s of the training split replayed beside them (rehearse=%g per example: "
                     "the model keeps what it knew)" % (_n(len(replay), "row"), rehearse))
    elif not base:
        parts.append("no base data to replay")
    if held:
        parts.append("%d of them held out" % len(held))
    parts.append("validated after every epoch on %s" % " + ".join(
        ([_n(test, "test row")] if test else []) +
        ["%d held-out examples" % len(held) if held else "your %s (trained on: fewer than %d)"
         % (_n(len(uy), "example"), _g.HOLDOUT_MIN)]))
    return train, val, "; ".join(parts)


def make(t, loss, val, on_worse, tol, batch_size, restore):
    """The Guard for this fit, validating through the session's trainer `t` (the model in eval
    mode, its rows viewed as the input shape) with `loss` (a loss object of its own: the
    training loss keeps its buffers): rollback through `restore` (the trainer's rollback copy:
    weights, optimizer state and lr) when the fit has one, else through the guard's own."""
    return _g.Guard(t, loss, val, tol, on_worse, batch_size, restore)


def policy(g):
    """The fit line's words for what the guard does."""
    if g.val is None:
        return "no validation: the last epoch stays unless the loss runs away"
    if g.on_worse == "rollback":
        return ("the best epoch is kept; a fit leaving validation worse by more than %s is rolled "
                "back (on_worse='rollback')" % g.tol_text())
    return "the best epoch is kept, also when worse than before (on_worse='keep')"


def finish(g, interrupted, verbose, on_error, lr):
    """The guard's end of a fit (g.finish(): the best epoch kept, or the state from before the
    fit put back), said in fit's lines; returns what it did ('interrupted', 'rollback', ...).
    lr: the fit's learning rate (a rollback puts back the one from before)."""
    if interrupted and g.diverged is None:
        # Ctrl-C: you chose to stop; the weights of the last full step stay, unjudged
        if verbose:
            print("fit: interrupted: the guard chose no epoch (the weights of the last full step stay; "
                  "s.evaluate() shows what they do)")
        return "interrupted"
    what, text = g.finish()
    if verbose or what == "rollback":
        print("fit: %s%s" % (text, "" if what != "rollback" else
                             "; rolled back: the weights, optimizer state and lr are those from "
                             "before this call" if on_error == "rollback" else
                             "; rolled back: the weights are those from before this call (with "
                             "on_error='keep' there is no copy of the optimizer state: Adam's "
                             "moments and lr are this fit's)"))
        if g.diverged is not None:
            print("fit: lr %g is too high for this model: try fit(lr=%g)" % (lr, lr / 10))
    return what
