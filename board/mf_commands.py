# mf_commands.py: the objects behind the session's rarer commands, imported on first use so that a
# session that only loads, fits and evaluates keeps their code off the heap (a board without
# PSRAM has a small one): the help text, Inputs (what one example is: its checks, for
# add_example, predict and lists of pairs), predict, a regression model's evaluate, and the
# texts of info and of the parts table. Nothing here takes a Session or changes one: the
# Session's methods pass what these need and keep what they return.
from array import array
from math import exp, sqrt

from microformer.data import Batches
from microformer.finite import float32_row
from microformer.tensor import Tensor

from mf_examples import SELECTIONS, Result, _is_number, _n
from mf_exfile import fmt


# finetune.HELP: the module's commands (finetune.help() prints it)
HELP = """finetune: fine-tune the checkpoint on flash, from the REPL
  s = finetune.Session(checkpoint='model.mfck', data=None, user_data='data/user.csv',
                       lr=0.02, batch_size=16, root=None, backend=None, verbose=True,
                       adapter=None)
  s = finetune.Session('iris.mfck')   another checkpoint on flash
  s = finetune.Session(adapter='model.adapter.mfck')
                                  the checkpoint + a LoRA adapter saved for it (s.save_adapter)
  s.help()                        the session's commands
  finetune.capture(s, read, label, n=None, rate_hz=50, count=1)
                                  examples from a sensor: read() returns one reading (a number
                                  or C numbers); a window model's example is L readings
  finetune.demo(root=None, n=24, epochs=10, seed=0)
                                  the Iris drift story in /demo (your files are not touched)
  finetune.demo_session(fresh=True, root=None, verbose=True)
                                  a Session on the demo's own files
Files on flash (relative to the board's cwd '/'; Session(root=...) prefixes them):
  model.mfck        the checkpoint `make deploy CHECKPOINT=path` copies: weights + meta (spec,
                    task, classes or targets, input_shape, features, mean/std, data, split seed,
                    n_train, history of on-board fits)
  data/<meta data>  the base data the model was trained on (header line, label last), when the
                    metadata names it ('data'); Session(data='data/x.csv') names another
  data/user.csv     your examples, raw units; add_example appends, clear_examples() moves the
                    file to data/user.csv.bak (then .bak2, ...)
  model.adapter.mfck  s.save_adapter()'s file: only the trained tensors, for model.mfck alone
  demo/             demo()'s own files (its checkpoint and examples)"""

SESSION_HELP = """Session commands (s = finetune.Session(); raw units; labels by name or index,
regression targets as numbers):
  s.info()                              what the session holds
  s.evaluate(data='test')               accuracy and per-class counts (regression: RMSE, MAE)
  s.predict(x)                          label and probabilities (regression: the numbers)
  s.add_example(x, label)               append one example to data/user.csv
  s.add_examples([(x, label), ...])
  s.num_examples()                      how many user examples
  s.clear_examples()                    move data/user.csv to a .bak (never deleted)
  s.parts()                             the model's parameter names and kinds
  s.freeze(*parts) / s.unfreeze(*parts) parts: a kind ('embedding' 'attention' 'norm' 'ffn' 'head'
                                        'input' 'bias' 'all'), a name or prefix ('3.self_attn',
                                        '5.weight'), a glob ('3.*', '*.bias'), a layer index
  s.frozen()                            the names of the frozen parameters
  s.fit(epochs=10, data=None, lr=None, verbose=None, batch_size=None, micro_batch='auto')
                                        data None: your examples if there are any, else 'train';
                                        micro_batch 'auto': the largest that fits the free heap
  s.plan(batch_size=None, micro_batch=None)
                                        the memory a fit step needs, part by part, and the free heap
  s.save(path=None)                     atomic: the old checkpoint survives a power cut
  s.lora(rank=4, alpha=8, targets=None)  targets None: 'attention' and 'ffn' (those present)
                                        LoRA adapters; the base frozen; prints trainable params
                                        and the memory the fine-tune needs
  s.save_adapter(path=None)             only the trained tensors (model.adapter.mfck)
  s.load_adapter(path)                  base + adapter (Session(adapter=path) at the start)
  s.merge()                             fold the adapters into the weights
  s.int8(parts=None)                    frozen weight matrices as int8 (a scale per row): prints
                                        the weight memory before and after
  s.drifted_examples(n=None, part='train', scale=None, offset=None, seed=0)
                                        the Iris demo's drifted sensor readings of base rows
x: one example: its features, or for a window model ([L, C] input) L*C numbers time-major or a
list of L readings of C numbers.
data: 'train' 'test' (the checkpoint's split), 'base', 'user', 'all', or a list of pairs
Ctrl-C during fit stops after the current step; the model keeps that step's weights."""

class Prediction(Result):
    """label, probs (one per class); unpacks as label, probs = s.predict(x)."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._fields[key]
        return (self.label, self.probs)[key]

    def __len__(self):
        return 2

    def __iter__(self):
        return iter((self.label, self.probs))


class Pairs(list):
    """A list of (features, label) pairs that the REPL shows in one line."""

    def __repr__(self):
        return "<%d (features, label) pairs; the first: %r>" % (len(self), self[0]) if self else "<no pairs>"


def fit_count(meta):
    """How many fits the checkpoint has seen (meta['history'] keeps only the last few)."""
    tot = meta.get("fit_totals")
    if isinstance(tot, dict) and isinstance(tot.get("fits"), int):
        return tot["fits"]
    return len(meta.get("history") or [])


def check_label(task, classes, targets, label, who, index=None):
    """A label for a model of `task`: a class name or index of `classes` -> the class index; a
    regression's target(s) (`targets` names them) -> a tuple of floats. ValueError naming `who`
    and what was expected otherwise (NaN / inf refused)."""
    if task == "regress":
        T = len(targets)
        v = label if isinstance(label, (list, tuple)) else [label]
        if len(v) != T or not all(_is_number(t) for t in v):
            raise ValueError("%s: %sthe target must be %s (%s), got %r"
                             % (who, "" if index is None else "example %d: " % index,
                                "a number" if T == 1 else "%d numbers" % T, ", ".join(targets), label))
        v = [float(t) for t in v]
        float32_row(who, v, targets, index)
        return tuple(v)
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(classes):
        return label
    if label in classes:
        return classes.index(label)
    raise ValueError("%s: unknown label %r (expected one of %s)" % (who, label, ", ".join(classes)))


class Inputs:
    """What one example of a model is, and its checks (raw units): `task` 'classify' or
    'regress', `input_shape` [F] or [L, C], `features` the channel names, `columns` one name per
    number, `classes` or `targets`. `labels`: a regression's texts of the last target as the
    user-data file holds them (a list this object appends to when an example brings a new one)."""

    def __init__(self, task, input_shape, features, columns, classes, targets, labels):
        self.task = task
        self.input_shape = input_shape
        self.features = features
        self.columns = columns
        self.classes = classes
        self.targets = targets
        self.labels = labels
        n = 1
        for d in input_shape:
            n *= d
        self.n = n

    def example(self, x, who, index=None):
        """One example -> a list of floats; NaN / inf (as float32: 1e39 too) refused. A window:
        L*C numbers time-major, or L readings of C numbers (flattened here)."""
        n = self.n
        shape = self.input_shape
        names = ", ".join(self.features)
        at = "" if index is None else "example %d: " % index
        if len(shape) == 2 and isinstance(x, (list, tuple)) and x and isinstance(x[0], (list, tuple)):
            L, C = shape
            if len(x) != L:
                raise ValueError("%s: %sexpected a window of %d readings of %d numbers (%s), got %d readings"
                                 % (who, at, L, C, names, len(x)))
            flat = []
            for t in range(L):
                r = x[t]
                if not isinstance(r, (list, tuple)) or len(r) != C:
                    raise ValueError("%s: %sreading %d must be %d numbers (%s), got %r"
                                     % (who, at, t, C, names, r))
                flat.extend(r)
            x = flat
        if not isinstance(x, (list, tuple)) or len(x) != n:
            if len(shape) == 2:
                raise ValueError("%s: %sexpected a window of %d readings x %d channels (%s): %d numbers "
                                 "time-major or a list of %d readings, got %s"
                                 % (who, at, shape[0], shape[1], names, n, shape[0],
                                    ("%d numbers" % len(x)) if isinstance(x, (list, tuple)) else repr(x)))
            raise ValueError("%s: %sexpected %d features (%s), got %r" % (who, at, n, names, x))
        cols = self.columns
        for j in range(n):
            if not isinstance(x[j], (int, float)) or isinstance(x[j], bool):
                raise ValueError("%s: %sfeature %d (%s) must be a number, got %r"
                                 % (who, "" if index is None else "example %d, " % index, j + 1,
                                    cols[j], x[j]))
        x = [float(v) for v in x]
        float32_row(who, x, cols, index)
        return x

    def label(self, label, who, index=None):
        """A class name or index -> the class index; a regression's target(s) -> a tuple of floats."""
        return check_label(self.task, self.classes, self.targets, label, who, index)

    def rows(self, pairs, who):
        """(features, label) pairs -> the user-data file's rows [(numbers, label index)], every
        pair checked first. A regression row: the numbers, the targets but the last, and the
        last as the label (its text added to `labels` when new)."""
        if not isinstance(pairs, (list, tuple)):
            raise ValueError("%s: expected a list of (features, label) pairs, got %r" % (who, pairs))
        checked = []
        for k in range(len(pairs)):
            pair = pairs[k]
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError("%s: expected (features, label), got %r" % (who, pair))
            i = None if who == "add_example" else k
            checked.append((self.example(pair[0], who, i), self.label(pair[1], who, i)))
        out = []
        for x, c in checked:
            if self.task == "regress":
                x = x + list(c[:-1])
                text = fmt(c[-1])
                if text not in self.labels:
                    self.labels.append(text)
                c = self.labels.index(text)
            out.append((x, c))
        return out

    def pairs(self, data, who):
        """A list of (features, label) pairs -> (flat array('f') of raw features, labels or
        target tuples), every pair checked."""
        if not isinstance(data, (list, tuple)) or not data:
            raise ValueError("%s: data must be one of %s or a non-empty list of (features, label) pairs"
                             % (who, ", ".join(repr(s) for s in SELECTIONS)))
        X = array("f")
        y = []
        for k, pair in enumerate(data):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError("%s: item %d must be a (features, label) pair, got %r" % (who, k, pair))
            X.extend(array("f", self.example(pair[0], who, k)))
            y.append(self.label(pair[1], who, k))
        return X, y


def predict(inputs, trainer, mean, std, features, verbose):
    """(label, [probability per class]) for one example in raw units (a Prediction); for a
    regression model a Result whose .values are the predicted targets. `trainer` runs the
    model (its logits in eval mode); mean, std: the inputs' standardization per channel."""
    x = inputs.example(features, "predict")
    n = inputs.n
    C = len(mean)
    X = Tensor((1, n))
    for j in range(n):
        X.data[j] = (x[j] - mean[j % C]) / std[j % C]
    out = trainer.logits(X).data
    if inputs.task == "regress":
        targets = inputs.targets
        values = [out[k] for k in range(len(targets))]
        text = ", ".join("%s %.4g" % (targets[k], values[k]) for k in range(len(values)))
        if verbose:
            print(text)
        return Result("<%s>" % text, {"values": values, "targets": list(targets)})
    classes = inputs.classes
    m = max(out)
    e = [exp(v - m) for v in out]
    s = sum(e)
    probs = [v / s for v in e]
    best = probs.index(max(probs))        # the first on ties
    label = classes[best]
    if verbose:
        print("%s  (%s)" % (label, ", ".join("%s %.3f" % (classes[c], probs[c]) for c in range(len(probs)))))
    return Prediction("<%s %.3f>" % (label, probs[best]), {"label": label, "probs": probs})


def evaluate_regress(trainer, ds, batch_size, targets, name, verbose):
    """RMSE and MAE per target of a regression model on `ds` (its y: tuples of targets)."""
    T = len(targets)
    sq = [0.0] * T
    ab = [0.0] * T
    for X, y in Batches(ds, batch_size):
        d = trainer.logits(X).data
        for b in range(len(y)):
            for k in range(T):
                e = d[b * T + k] - y[b][k]
                sq[k] += e * e
                ab[k] += abs(e)
    n = len(ds)
    rmse = [sqrt(v / n) for v in sq]
    mae = [v / n for v in ab]
    text = ", ".join("%s RMSE %.4g MAE %.4g" % (targets[k], rmse[k], mae[k]) for k in range(T))
    if verbose:
        print("%s on %s (%s)" % (text, name, _n(n, "example")))
    return Result("<%s on %s (%d)>" % (text, name, n),
                  {"rmse": rmse, "mae": mae, "n": n, "data": name, "targets": list(targets)})


def parts_table(parts, frozen, verbose):
    """s.parts(): [(name, shape, kinds, frozen)] of microformer.parts' Parts; printed one a line."""
    out = []
    for p in parts:
        out.append((p.name, p.shape(), list(p.kinds), p.name in frozen))
    if verbose:
        for name, shape, kinds, f in out:
            print("%-36s %-12s %s%s" % (name, "x".join(str(d) for d in shape), " ".join(kinds),
                                        "  (frozen)" if f else ""))
    return out


def changed_text(who, changed, flag):
    """freeze / unfreeze's line: what changed, or that it already was so."""
    n = 0
    for p in changed:
        n += p.size
    return "%s %s (%d params)%s" % (who, _n(len(changed), "parameter"), n,
                                    ": " + ", ".join("%s %s" % (p.name, "x".join(str(d) for d in p.shape()))
                                                     for p in changed) if changed else
                                    " (already %s)" % ("trainable" if flag else "frozen"))


def info_text(path, meta, params, task, outputs, input_text, data_path, base_rows, user_path, n_user,
              trainable, batch, need, free):
    """s.info()'s lines."""
    return "\n".join((
        "checkpoint %s: %s, %d params; %s %s; input %s"
        % (path, meta.get("arch", "model"), params, "classes" if task == "classify" else "regression of",
           ", ".join(outputs), input_text),
        "pretrained: train %s, test %s; on-board fits: %d"
        % (meta.get("train_acc"), meta.get("test_acc"), fit_count(meta)),
        "base data %s (%d rows); user data %s (%d examples)" % (data_path, base_rows, user_path, n_user),
        trainable,
        "memory for a batch of %d: %d bytes (free heap %s)" % (batch, need, free)))


def missing(path, deployed):
    """The error of a Session with no checkpoint at `path`: which ones this folder has and how
    to open one (`deployed`: the name make deploy gives the checkpoint on a board)."""
    import os
    d = path.rsplit("/", 1)[0] if "/" in path else ""
    try:
        have = sorted(n for n in os.listdir(d or ".") if n.endswith(".mfck"))
    except OSError:
        have = []
    if have:
        how = ("; %s has %s: open one with finetune.Session(%r)"
               % ("this board" if not d else d, ", ".join(have), have[0]))
    else:
        how = " (make deploy CHECKPOINT=path copies yours to the board as %s)" % deployed
    return OSError(2, "Session: no checkpoint at %r%s" % (path, how))


def split_note(test, rows, path, percent, seed):
    """The note of a session that chose the test split of a checkpoint that gives none."""
    return ("split: the checkpoint gives none ('split' or 'n_train'): the board chose "
            "%d of the %d rows of %s as 'test' (%d%%, shuffled with split_seed %d) and "
            "keeps them in the checkpoint's metadata: s.save() writes them, and every "
            "later session uses the same rows" % (test, rows, path, percent, seed))
