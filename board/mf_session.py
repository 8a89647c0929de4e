# mf_session.py: finetune.Session, a model loaded from flash with its data, ready to evaluate,
# predict and fine-tune (MicroPython or CPython). The REPL entry point is finetune.py.
# The model, its classes and its input standardization all come from the checkpoint's metadata.
import gc
import os
from array import array
from math import exp

import microformer as mf
from microformer import checkpoint
from microformer.data import Dataset, read_rows
from microformer.finite import float32_row, hyper
from microformer.spec import from_spec, spec_of
from microformer.tensor import Rng, Tensor
from microformer.train import duration, evaluate as _evaluate, fit as _fit, predict_logits

from mf_examples import Examples

CHECKPOINT = "iris.mfck"
DATA = "data/iris.csv"
USER_DATA = "data/user.csv"
FIT_EPOCHS = 10
FIT_LR = 0.02

PARTS = ("embed", "attention", "head", "all")
SELECTIONS = ("train", "test", "base", "user", "all")


SESSION_HELP = """Session commands (s = finetune.Session(); raw units, labels by name or index):
  s.info()                              what the session holds
  s.evaluate(data='test')               accuracy and per-class counts
  s.predict(features)                   label and probabilities for one reading
  s.add_example(features, label)        append one example to data/user.csv
  s.add_examples([(features, label), ...])
  s.num_examples()                      how many user examples
  s.clear_examples()                    move data/user.csv to a .bak (never deleted)
  s.freeze(*parts) / s.unfreeze(*parts) parts: 'embed' 'attention' 'head' 'all' or a layer index
  s.fit(epochs=10, data=None, lr=None, verbose=None)
                                        data None: your examples if there are any, else 'train'
  s.save(path=None)                     atomic: the old checkpoint survives a power cut
  s.drifted_examples(n=None, part='train', scale=None, offset=None, seed=0)
                                        the demo's drifted sensor readings of base rows
data: 'train' 'test' (the checkpoint's split), 'base', 'user', 'all', or a list of pairs
Ctrl-C during fit stops after the current step; the model keeps that step's weights."""


class Result:
    """A small result: its fields as attributes and as r['field']; repr is one line."""

    def __init__(self, line, fields):
        self._line = line
        self._fields = fields
        for k in fields:
            setattr(self, k, fields[k])

    def __getitem__(self, key):
        return self._fields[key]

    def get(self, key, default=None):
        return self._fields.get(key, default)

    def keys(self):
        return self._fields.keys()

    def __repr__(self):
        return self._line


class FitResult(Result):
    """What fit did: steps, epochs, seconds, ms_per_step, loss, data, interrupted; indexing and
    iterating give the per-epoch records of the last FIT_KEEP_EPOCHS epochs (h[-1]['loss']),
    oldest first; h.history is their list."""

    def __init__(self, line, fields, history):
        Result.__init__(self, line, fields)
        self.history = history

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._fields[key]
        return self.history[key]

    def __len__(self):
        return len(self.history)

    def __iter__(self):
        return iter(self.history)


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


def _mem_free():
    gc.collect()
    try:
        return gc.mem_free()
    except AttributeError:
        return None


def _n(k, word):
    """'1 step', '2 steps'."""
    return "%d %s%s" % (k, word, "" if k == 1 else "s")


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


class Session:
    """A model loaded from flash with its data, ready to evaluate, predict and fine-tune.

    Session(checkpoint='iris.mfck', data='data/iris.csv', user_data='data/user.csv',
            lr=FIT_LR, batch_size=16, root=None, backend=None, verbose=True)
    root: a folder the three paths are relative to (None: the cwd, '/' on the board).
    backend: 'python' or 'viper' (None: leave microformer's current backend).
    """

    def __init__(self, checkpoint=CHECKPOINT, data=DATA, user_data=USER_DATA, lr=FIT_LR,
                 batch_size=16, root=None, backend=None, verbose=True):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("Session: batch_size must be a positive int, got %r" % (batch_size,))
        lr = hyper("Session", "lr", lr, 0.0, None, True)
        if backend:
            mf.set_backend(backend)
        self.root = root
        self.checkpoint_path = self._path(checkpoint)
        self.data_path = self._path(data) if data else None
        self.user_path = self._path(user_data)
        self.lr = float(lr)
        self.batch_size = batch_size
        self.verbose = verbose
        self.model = None
        self.need = None
        self._opt = None
        self._fits = 0
        self._cache = {}
        try:
            self._load()
        except MemoryError:
            self._cache = {}
            raise self._oom("loading %s" % self.checkpoint_path)

    def help(self):
        """Print the session's commands (SESSION_HELP)."""
        print(SESSION_HELP)

    def _path(self, p):
        if not self.root or p.startswith("/"):
            return p
        return self.root.rstrip("/") + "/" + p

    def _say(self, s):
        if self.verbose:
            print(s)

    # ---- loading ------------------------------------------------------------------------

    def _load(self):
        try:
            os.stat(self.checkpoint_path)
        except OSError:
            raise OSError(2, "Session: no checkpoint at %r (make deploy copies one to the board; or pass "
                          "checkpoint=path)" % self.checkpoint_path)
        head = checkpoint.read_header(self.checkpoint_path)   # CheckpointError names the file
        meta = head["meta"]
        for key in ("classes", "mean", "std"):
            if key not in meta:
                raise checkpoint.CheckpointError("checkpoint %r: metadata lacks %r (write it with "
                                                 "host/pretrain.py)" % (self.checkpoint_path, key))
        # the model comes from meta['spec']; checkpoints older than specs: from meta['layers'] or
        # arch 'iris-attention-v1' (spec_of says which), and save() then writes the spec
        spec = spec_of(meta, "checkpoint %r" % self.checkpoint_path)
        self.meta = meta
        self.classes = list(meta["classes"])
        self.mean = [float(v) for v in meta["mean"]]
        self.std = [float(v) for v in meta["std"]]
        self.num_features = len(self.mean)
        self.features = list(meta.get("features") or ["x%d" % j for j in range(self.num_features)])
        self._params_in_file = 0
        for _, shape in head["tensors"]:
            n = 1
            for d in shape:
                n *= d
            self._params_in_file += n
        mf.seed(meta.get("init_seed", 1))
        self.model = from_spec(spec)
        self.need = self.model.summary((self.batch_size, self.num_features), show=False)
        checkpoint.load(self.checkpoint_path, self.model)     # verified before any weight changes
        self._loss = mf.CrossEntropyLoss()
        self._base = None
        if self.data_path:
            try:
                os.stat(self.data_path)
                have = True
            except OSError:
                have = False
                self._say("note: no base data at %s (evaluate/fit need 'user' or a list)" % self.data_path)
            if have:
                X, y, _, names = self._read(self.data_path)
                self._base = Dataset(Tensor((len(y), self.num_features), X), y, self.classes, names) \
                    if y else None
        self._examples = Examples(self.user_path, self.features, self.classes, self._read)
        self._say("%s: %s, %d params, classes %s; base %d rows, user %d examples; backend %s"
                  % (self.checkpoint_path, meta.get("arch", "model"), self.model.param_count(),
                     ", ".join(self.classes), len(self._base) if self._base else 0,
                     len(self._examples.y), mf.get_backend()))

    def _read(self, path):
        # microformer.data's CSV reader; its error (file, line, column, value) says how to go on
        try:
            return read_rows(path, self.classes, None, self.num_features, "Session")
        except ValueError as e:
            raise type(e)("%s. Fix or delete that line (from the host: mpremote edit :%s), then "
                          "start a new Session" % (e, path))

    def _oom(self, what):
        # Drop what we can, then say what the model needs and what the heap has.
        gc.collect()
        free = _mem_free()
        if self.need is not None:
            need = ("the model needs about %d bytes: %d params = %d bytes with grads, Adam state and "
                    "the step's snapshot, "
                    "activations for a batch of %d = %d bytes"
                    % (self.need["total_bytes"], self.need["params"], self.need["param_bytes"],
                       self.batch_size, self.need["activation_bytes"]))
        else:
            n = getattr(self, "_params_in_file", 0)
            need = ("the model needs about %d bytes for its %d params (with grads, Adam state and the "
                    "step's snapshot), plus its activations" % (28 * n, n))
        total = self.need["total_bytes"] if self.need else 0
        frag = " (fragmented: no block large enough)" if free is not None and free > total else ""
        return MemoryError("Session: out of memory %s: %s; free heap %s bytes%s. Try a smaller "
                           "batch_size, or free memory (del big objects, gc.collect())"
                           % (what, need, "n/a" if free is None else free, frag))

    # ---- data ---------------------------------------------------------------------------

    def _standardized(self, X, y):
        F = self.num_features
        d = array("f", X)
        mean, std = self.mean, self.std
        for i in range(len(y)):
            for j in range(F):
                d[i * F + j] = (d[i * F + j] - mean[j]) / std[j]
        return Dataset(Tensor((len(y), F), d), y, self.classes, self.features) if y else None

    def _split_idx(self):
        n = len(self._base)
        n_train = self.meta.get("n_train", n)
        idx = Rng(self.meta.get("split_seed", 0)).shuffle(list(range(n)))
        return idx[:n_train], idx[n_train:]

    def _raw(self, which):
        """(flat raw features, labels) of a named selection."""
        if which == "user":
            return self._examples.X, self._examples.y
        if self._base is None:
            raise ValueError("Session: no base data (%s missing); use data='user' or a list"
                             % self.data_path)
        F = self.num_features
        X, y = self._base.X.data, self._base.y
        if which == "base":
            return X, y
        if which == "all":
            return X + self._examples.X, y + self._examples.y
        train, test = self._split_idx()
        idx = train if which == "train" else test
        out = array("f")
        for i in idx:
            out.extend(X[i * F:(i + 1) * F])
        return out, [y[i] for i in idx]

    def _select(self, data, who):
        """A standardized Dataset for a selection name or a list of (features, label) pairs."""
        if isinstance(data, str):
            if data not in SELECTIONS:
                raise ValueError("%s: data must be one of %s or a list of (features, label) pairs, got %r"
                                 % (who, ", ".join(repr(s) for s in SELECTIONS), data))
            ds = self._cache.get(data)
            if ds is None:
                ds = self._standardized(*self._raw(data))
                if ds is None:
                    raise ValueError("%s: no %s examples yet (add some with s.add_example(features, label))"
                                     % (who, data))
                self._cache[data] = ds
            return data, ds
        if isinstance(data, Dataset):
            return "dataset", data
        if not isinstance(data, (list, tuple)) or not data:
            raise ValueError("%s: data must be one of %s or a non-empty list of (features, label) pairs"
                             % (who, ", ".join(repr(s) for s in SELECTIONS)))
        X = array("f")
        y = []
        for k, pair in enumerate(data):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError("%s: item %d must be a (features, label) pair, got %r" % (who, k, pair))
            X.extend(array("f", self._check_features(pair[0], who, k)))
            y.append(self._check_label(pair[1], who))
        return "list of %d" % len(y), self._standardized(X, y)

    def _check_features(self, x, who, index=None):
        # one reading (raw units) -> list of floats; NaN / inf (as float32: 1e39 too) refused
        F = self.num_features
        if not isinstance(x, (list, tuple)) or len(x) != F:
            raise ValueError("%s: %sexpected %d features (%s), got %r"
                             % (who, "" if index is None else "example %d: " % index, F,
                                ", ".join(self.features), x))
        for j in range(F):
            if not isinstance(x[j], (int, float)) or isinstance(x[j], bool):
                raise ValueError("%s: %sfeature %d (%s) must be a number, got %r"
                                 % (who, "" if index is None else "example %d, " % index, j + 1,
                                    self.features[j], x[j]))
        x = [float(v) for v in x]
        float32_row(who, x, self.features, index)
        return x

    def _check_label(self, label, who):
        if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(self.classes):
            return label
        if label in self.classes:
            return self.classes.index(label)
        raise ValueError("%s: unknown label %r (expected one of %s)"
                         % (who, label, ", ".join(self.classes)))

    def num_examples(self):
        """The number of user examples."""
        return len(self._examples.y)

    def add_example(self, features, label):
        """Append one labelled reading (raw units) to the user data file and to this session."""
        return self.add_examples([(features, label)], "add_example")

    def add_examples(self, pairs, who="add_examples"):
        """Append (features, label) pairs (raw units); checked first, then written in one go."""
        if not isinstance(pairs, (list, tuple)):
            raise ValueError("%s: expected a list of (features, label) pairs, got %r" % (who, pairs))
        rows = []
        for k in range(len(pairs)):
            pair = pairs[k]
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError("%s: expected (features, label), got %r" % (who, pair))
            x = self._check_features(pair[0], who, None if who == "add_example" else k)
            c = self._check_label(pair[1], who)
            rows.append((x, c))
        self._examples.append(rows)
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        self._say("%d user example%s in %s" % (len(self._examples.y), "" if len(self._examples.y) == 1 else "s",
                                               self.user_path))
        return len(self._examples.y)

    def clear_examples(self):
        """Forget the user examples; the user data file is kept as a backup (user.csv.bak, then
        .bak2, ...), never deleted. Returns the backup's path (None if there was no file)."""
        n = len(self._examples.y)
        kept = self._examples.clear()
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        if kept:
            self._say("user examples cleared: %d example%s moved to %s (to restore: "
                      "os.rename(%r, %r))" % (n, "" if n == 1 else "s", kept, kept, self.user_path))
        else:
            self._say("no user examples to clear (%s does not exist)" % self.user_path)
        return kept

    def drifted_examples(self, n=None, part="train", scale=None, offset=None, seed=0):
        """(features, label) pairs as the demo's drifted sensor reads base rows (raw units);
        see mf_demo.drifted_examples."""
        from mf_demo import drifted_examples
        return Pairs(drifted_examples(self, n, part, scale, offset, seed))

    # ---- training and evaluation --------------------------------------------------------

    def _part_layers(self, part):
        L = self.model.layers
        att = [i for i in range(len(L)) if type(L[i]).__name__ == "Attention"]
        first = att[0] if att else len(L)
        last = att[-1] if att else len(L) - 1
        if isinstance(part, int) and not isinstance(part, bool):
            if -len(L) <= part < len(L):
                return [part % len(L)]
        elif part == "embed":
            return list(range(first))
        elif part == "attention":
            return att
        elif part == "head":
            return list(range(last + 1, len(L)))
        elif part == "all":
            return list(range(len(L)))
        raise ValueError("freeze: unknown part %r (expected 'embed', 'attention', 'head', 'all' "
                         "or a layer index 0..%d)" % (part, len(L) - 1))

    def _set_trainable(self, parts, flag):
        if not parts:
            parts = ("all",)
        idx = []
        for p in parts:
            idx.extend(self._part_layers(p))     # check every part before changing any
        for i in idx:
            self.model.layers[i].trainable = flag
        self._opt = None                         # the optimizer's parameter list changes
        self._say(self.trainable_summary())

    def freeze(self, *parts):
        """Keep these parts' weights fixed in fit(): 'embed', 'attention', 'head', 'all', an index."""
        self._set_trainable(parts, False)

    def unfreeze(self, *parts):
        """Train these parts again (no argument: everything)."""
        self._set_trainable(parts, True)

    def trainable_summary(self):
        L = self.model.layers
        names = []
        n = 0
        for i in range(len(L)):
            c = L[i].param_count()
            if c:
                names.append("%d %s%s" % (i, type(L[i]).__name__, "" if L[i].trainable else " (frozen)"))
                if L[i].trainable:
                    n += c
        return "trainable params %d of %d: %s" % (n, self.model.param_count(), ", ".join(names))

    def fit(self, epochs=FIT_EPOCHS, data=None, lr=None, verbose=None, on_error="rollback"):
        """Fine-tune; one line per epoch (loss, acc, ms/step, free heap) and a progress line at
        least every 5 s. Returns a FitResult (steps, epochs, seconds, loss, ...; h[-1] is the
        last epoch's record; the last FIT_KEEP_EPOCHS epochs' records are kept).

        data: None ('user' if there are user examples, else 'train'; fit says which and why),
        a selection name or a list of (features, label) pairs.
        on_error: 'rollback' (default): a refused step (NonFiniteError) or running out of memory
        restores the weights, optimizer state and lr from the start of this call, so a failed
        fit changes nothing (it costs a copy of the trainable weights and Adam state, 12 bytes
        per parameter, kept with the optimizer); 'keep': the weights of the last good step stay.
        Every argument is checked before anything changes. Ctrl-C stops after the current step;
        the model keeps the weights of the last full step (either way).
        """
        # ---- every argument first: a refused call changes nothing
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError("fit: epochs must be an int >= 1, got %r" % (epochs,))
        if lr is not None:
            lr = hyper("fit", "lr", lr, 0.0, None, True)
        if verbose is not None and not isinstance(verbose, bool):
            raise ValueError("fit: verbose must be True, False or None (the session's setting), got %r"
                             % (verbose,))
        if on_error not in FIT_ON_ERROR:
            raise ValueError("fit: on_error must be one of %s, got %r"
                             % (", ".join(repr(v) for v in FIT_ON_ERROR), on_error))
        if data is None:
            n_user = len(self._examples.y)
            data = "user" if n_user else "train"
            why = ("your %d example%s in %s (data=None picks them when there are any; data='train' "
                   "for the pretraining split)" % (n_user, "" if n_user == 1 else "s", self.user_path)
                   if n_user else "the checkpoint's training split (data=None: no user examples yet)")
        else:
            why = None
        name, ds = self._select(data, "fit")
        if why is None:
            why = "%s, as asked" % name
        # garbage out first: what fit keeps (optimizer, rollback copy, history) then goes into the
        # lowest free blocks, and the large ones stay whole for a new batch shape's buffers
        gc.collect()
        if self._opt is None:
            if not self.model.collect_params([]):
                raise ValueError("fit: every layer is frozen; unfreeze something first (s.unfreeze())")
            try:                        # its state and the step's shadow: a few blocks of 4 bytes per param
                self._opt = mf.Adam(self.model, lr=self.lr if lr is None else lr)
            except MemoryError:
                self._opt = None
                raise self._oom("creating the optimizer")
        snap = None
        if on_error == "rollback":
            snap = getattr(self, "_snap", None)
            if snap is None or snap.opt is not self._opt:
                self._snap = None
                try:
                    snap = self._snap = _Snapshot(self._opt)
                except MemoryError:
                    raise self._oom("making fit's rollback copy (%d bytes; fit(on_error='keep') "
                                    "trains without it)" % (12 * self._opt._n))
            snap.take(self)
        # ---- from here on, state changes
        if lr is not None:
            self.lr = lr
            self._opt.lr = lr
        verbose = self.verbose if verbose is None else verbose
        batch = min(self.batch_size, len(ds))
        if verbose:
            print("fit on %s: %s, %s, batch %d, lr %g; %s"
                  % (why, _n(len(ds), "example"), _n(epochs, "epoch"), batch, self.lr,
                     self.trainable_summary()))
        log = _fit_log()
        steps0 = self._opt.steps
        self._fits += 1
        try:
            _fit(self.model, self._loss, self._opt, ds, epochs=epochs, batch_size=batch, seed=self._fits,
                 verbose=verbose, log=log)
        except KeyboardInterrupt:
            # between steps (train.fit catches it inside one); no update is ever half done
            log.interrupted = True
        except Exception as e:
            self.model.train()
            if isinstance(e, MemoryError):
                e = self._oom("in fit, training (batch %d; %d of %d epochs and %d steps done)"
                              % (batch, log.epochs, epochs, self._opt.steps - steps0))
            if snap is not None:
                undone = self._opt.steps - steps0
                snap.restore(self)
                raise type(e)("%s; fit rolled back: the weights, optimizer state and lr are those "
                              "from before this call (%s undone)" % (e, _n(undone, "step")))
            rec = _fit_record(self, name, len(ds), log, self._opt.steps - steps0)
            rec["error"] = type(e).__name__
            _add_fit(self.meta, rec)
            raise type(e)("%s; fit(on_error='keep'): the model keeps the weights of the last good "
                          "step (%s of this call, recorded in the fit history)"
                          % (e, _n(rec["steps"], "step")))
        finally:
            self.model.train()
        steps = log.steps               # the history's count (the optimizer's, when all is well)
        rec = _fit_record(self, name, len(ds), log, steps)
        _add_fit(self.meta, rec)
        seconds = rec["seconds"]
        interrupted = rec["interrupted"]
        if verbose:
            if interrupted:
                print("interrupted: stopped after %d full steps; the model keeps the weights of the last "
                      "full step (s.save() keeps them, a new Session() drops them)" % steps)
            print("fit: %s in %s (%s/step)" % (_n(steps, "step"), duration(1000 * seconds),
                                                   duration(1000 * seconds / max(1, steps))))
        try:
            hist = log.records()
        except MemoryError:
            raise MemoryError("fit: out of memory after training, making the records of the last %d "
                              "epochs (free heap %s bytes): the %s are done, kept by the model and "
                              "recorded in s.meta['history']; only this call's per-epoch records are "
                              "lost. Free memory (del big objects, gc.collect())"
                              % (log.keep, _mem_free(), _n(steps, "step")))
        line = "<fit on %s: %s, %s%s, %s/step%s>" % (
            name, _n(steps, "step"), _n(rec["epochs"], "epoch"), "" if rec["loss"] is None else ", loss %.4f" % rec["loss"],
            duration(1000 * seconds / max(1, steps)), ", interrupted" if interrupted else "")
        return FitResult(line, rec, hist)

    def evaluate(self, data="test", verbose=None):
        """Accuracy and per-class counts on a selection (default 'test') or a list of pairs."""
        name, ds = self._select(data, "evaluate")
        try:
            acc, confusion = _evaluate(self.model, ds, self.batch_size)
        except MemoryError:
            raise self._oom("in evaluate")
        finally:
            self.model.train()
        per = {}
        for c in range(len(self.classes)):
            per[self.classes[c]] = (confusion[c][c], sum(confusion[c]))
        correct = sum(confusion[c][c] for c in range(len(self.classes)))
        out = Result("<accuracy %.1f%% (%d/%d) on %s>" % (100 * acc, correct, len(ds), name),
                     {"accuracy": acc, "correct": correct, "n": len(ds), "per_class": per,
                      "confusion": confusion, "data": name})
        if self.verbose if verbose is None else verbose:
            print("accuracy %.1f%% (%d/%d) on %s; %s" % (
                100 * acc, correct, len(ds), name,
                ", ".join("%s %d/%d" % (k, per[k][0], per[k][1]) for k in self.classes)))
        return out

    def predict(self, features, verbose=None):
        """(label, [probability per class]) for one reading in raw units."""
        x = self._check_features(features, "predict")
        F = self.num_features
        X = Tensor((1, F))
        for j in range(F):
            X.data[j] = (x[j] - self.mean[j]) / self.std[j]
        logits = predict_logits(self.model, X).data
        m = max(logits)
        e = [exp(v - m) for v in logits]
        s = sum(e)
        probs = [v / s for v in e]
        best = 0
        for c in range(1, len(probs)):
            if probs[c] > probs[best]:
                best = c
        label = self.classes[best]
        if self.verbose if verbose is None else verbose:
            print("%s  (%s)" % (label, ", ".join("%s %.3f" % (self.classes[c], probs[c])
                                                 for c in range(len(probs)))))
        return Prediction("<%s %.3f>" % (label, probs[best]), {"label": label, "probs": probs})

    def save(self, path=None):
        """Write the checkpoint atomically (default: the one this session loaded)."""
        path = self._path(path) if path else self.checkpoint_path
        self.meta["user_examples"] = len(self._examples.y)
        n = checkpoint.save(path, self.model, self.meta)
        self._say("saved %s (%d bytes)" % (path, n))
        return n

    def info(self):
        """Print what this session holds."""
        m = self.meta
        print("checkpoint %s: %s, %d params; classes %s; features %s"
              % (self.checkpoint_path, m.get("arch", "model"), self.model.param_count(),
                 ", ".join(self.classes), ", ".join(self.features)))
        print("pretrained: train %s, test %s; on-board fits: %d"
              % (m.get("train_acc"), m.get("test_acc"), _fit_count(m)))
        print("base data %s (%d rows); user data %s (%d examples)"
              % (self.data_path, len(self._base) if self._base else 0, self.user_path, len(self._examples.y)))
        print(self.trainable_summary())
        print("memory for a batch of %d: %d bytes (free heap %s)"
              % (self.batch_size, self.need["total_bytes"], _mem_free()))

    def __repr__(self):
        return "<finetune.Session %s: %d user examples>" % (self.checkpoint_path, len(self._examples.y))


    @property
    def _user_y(self):
        return self._examples.y


# ---- fit's history and rollback -----------------------------------------------------------
# A fit keeps the per-epoch records of its last FIT_KEEP_EPOCHS epochs (the FitResult) and
# running totals over all of them; the checkpoint keeps the records of the last FIT_KEEP_FITS
# fits in meta['history'] and totals over every fit in meta['fit_totals']. Both are bounded, so
# a fit of any length holds, and saves, the same few KB.
FIT_KEEP_EPOCHS = 50
FIT_KEEP_FITS = 20
FIT_ON_ERROR = ("rollback", "keep")


def _fit_log():
    from microformer.train import FitLog
    return FitLog(FIT_KEEP_EPOCHS)


def _fit_record(s, name, n, log, steps):
    """The session's record of one fit (what meta['history'] keeps)."""
    loss = None
    if log.epochs:
        loss = log.record(log.epochs - 1)["loss"]
    L = s.model.layers
    return {"data": name, "n": n, "epochs": log.epochs, "steps": steps, "lr": s.lr,
            "seconds": log.ms / 1000, "interrupted": log.interrupted, "loss": loss,
            "frozen": [i for i in range(len(L)) if not L[i].trainable]}


def _add_fit(meta, rec):
    """Append a fit's record to meta['history'], keeping the last FIT_KEEP_FITS; meta['fit_totals']
    counts every fit (fits, epochs, steps, seconds), also those whose records were dropped."""
    hist = meta.get("history")
    if not isinstance(hist, list):
        hist = []
    tot = meta.get("fit_totals")
    if not isinstance(tot, dict):         # a checkpoint from before the totals: count its records
        tot = {"fits": 0, "epochs": 0, "steps": 0, "seconds": 0.0}
        for h in hist:
            if isinstance(h, dict):
                tot["fits"] += 1
                for k in ("epochs", "steps", "seconds"):
                    v = h.get(k)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        tot[k] += v
    hist.append(rec)
    tot["fits"] += 1
    tot["epochs"] += rec["epochs"]
    tot["steps"] += rec["steps"]
    tot["seconds"] += rec["seconds"]
    if len(hist) > FIT_KEEP_FITS:
        hist = hist[len(hist) - FIT_KEEP_FITS:]
    meta["history"] = hist
    meta["fit_totals"] = tot


class _Snapshot:
    """fit's rollback copy: the optimizer's trainable weights and state (Adam m, v), its step count
    and lr, the session's lr and fit counter; made once per optimizer, taken at each fit."""

    def __init__(self, opt):
        self.opt = opt
        self.w = [array("f", bytes(4 * p.size)) for p, _ in opt.params]
        self.live = [array("f", bytes(4 * opt._n)) for _ in opt._live]

    def take(self, s):
        from microformer import backend
        K = backend.K
        opt = self.opt
        for i in range(len(opt.params)):
            p = opt.params[i][0]
            K.copy(self.w[i], p.data, p.size)
        for j in range(len(opt._live)):
            K.copy(self.live[j], opt._live[j], opt._n)
        self.steps = opt.steps
        self.opt_lr = opt.lr
        self.lr = s.lr
        self.fits = s._fits

    def _put(self, s):
        from microformer import backend
        K = backend.K
        opt = self.opt
        for i in range(len(opt.params)):
            p = opt.params[i][0]
            K.copy(p.data, self.w[i], p.size)
        for j in range(len(opt._live)):
            K.copy(opt._live[j], self.live[j], opt._n)
        opt.steps = self.steps
        opt.lr = self.opt_lr
        s.lr = self.lr
        s._fits = self.fits

    def restore(self, s):
        # a Ctrl-C during the copy is held until the copy is complete, then raised
        held = None
        while True:
            try:
                self._put(s)
                break
            except KeyboardInterrupt as e:
                held = e
        if held is not None:
            raise held


def _fit_count(meta):
    """How many fits the checkpoint has seen (meta['history'] keeps only the last few)."""
    tot = meta.get("fit_totals")
    if isinstance(tot, dict) and isinstance(tot.get("fits"), int):
        return tot["fits"]
    return len(meta.get("history") or [])
