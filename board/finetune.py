# finetune.py: fine-tune a pretrained model on the board, from the REPL (MicroPython or CPython).
# The model, its classes and its input standardization all come from the checkpoint's metadata.
"""
    >>> import finetune
    >>> s = finetune.Session()           # model + checkpoint + data from flash
    >>> s.evaluate()                     # held-out accuracy and per-class counts (returns a dict)
    >>> s.predict([5.9, 3.0, 5.1, 1.8])  # label and probabilities, raw units (cm)
    >>> s.add_example([6.1, 2.8, 4.7, 1.2], 'versicolor')   # appended to /data/user.csv
    >>> s.freeze('attention')            # 'embed' | 'attention' | 'head' | 'all' | layer index
    >>> s.fit(epochs=5)                  # the user examples (the base training split if none)
    >>> s.save()                         # atomic: the old checkpoint survives a power cut

Files on flash (paths relative to the board's cwd '/'; Session(root=...) prefixes them):
    /iris.mfck        the checkpoint: weights + meta (layers, classes, features, mean/std,
                      split seed, accuracies, history of on-board fits); host/pretrain.py writes it
    /data/iris.csv    the base dataset the host pretrained on (header line, label name last)
    /data/user.csv    the user's examples, raw units, same format; add_example appends to it,
                      clear_examples() moves it to /data/user.csv.bak (then .bak2, ...)
    /demo/            demo()'s own files (its checkpoint and examples); yours are not touched
    /lib/microformer  the package

Data selections (fit(data=...), evaluate(data=...)):
    'train', 'test'   the checkpoint's split of the base file (the split seed is in the meta)
    'base'            every base row;  'user': the user examples;  'all': base + user
    a list of (features, label) pairs in raw units, e.g. s.drifted_examples(part='test')
fit() defaults to 'user' when there are user examples, else 'train'; evaluate() to 'test'.

The drift demo: a sensor whose readings drift by a fixed scale and offset per feature.
    >>> held = s.drifted_examples(part='test')      # the 30 held-out rows, as the sensor reads them
    >>> s.evaluate(held)                            # the pretrained model: accuracy drops
    >>> s.add_examples(s.drifted_examples(24))      # 24 labelled readings from the drifted sensor
    >>> s.fit(epochs=FIT_EPOCHS)                    # embed trainable, attention and head frozen
    >>> s.evaluate(held); s.save()                  # accuracy back up; survives a soft reset
"""
import gc
import os
import time
from array import array
from math import exp

import microformer as mf
from microformer import checkpoint
from microformer.data import Dataset, read_rows
from microformer.finite import float32_row, hyper
from microformer.tensor import Rng, Tensor
from microformer.train import evaluate as _evaluate, fit as _fit, predict_logits

CHECKPOINT = "iris.mfck"
DATA = "data/iris.csv"
USER_DATA = "data/user.csv"
DEMO_DIR = "demo"                   # demo()'s own folder: the user's files stay untouched
DEMO_PRETRAINED = "pretrained.mfck"     # in DEMO_DIR: where every demo run starts (make demo puts it)

# The seed's Iris model (host/pretrain.py writes the same list into meta['layers']).
IRIS_LAYERS = [["Dense", 4, 32], ["ActivationLayer", "relu"], ["Reshape", [4, 8]],
               ["Attention", 8, 2], ["GlobalAvgPool"], ["Dense", 8, 3]]

# The demo's drifting sensor: reading = true value * scale + offset, per feature (cm).
DRIFT_SCALE = (1.1, 0.9, 0.6, 0.5)
DRIFT_OFFSET = (0.4, -0.3, 1.2, 0.7)
FIT_EPOCHS = 10
FIT_LR = 0.02
FREEZE = ("attention", "head")      # what the demo freezes: the drift is absorbed by the embedding

PARTS = ("embed", "attention", "head", "all")
SELECTIONS = ("train", "test", "base", "user", "all")


def _ms():
    try:
        return time.ticks_ms()
    except AttributeError:
        return int(time.time() * 1000)


def _mem_free():
    gc.collect()
    try:
        return gc.mem_free()
    except AttributeError:
        return None


def build_layers(layers, seed=1):
    """Sequential from a layer list like IRIS_LAYERS: [class name, *args] (a trailing dict: kwargs)."""
    mf.seed(seed)
    out = []
    for i, spec in enumerate(layers):
        if not isinstance(spec, (list, tuple)) or not spec or not isinstance(spec[0], str):
            raise ValueError("build_layers: layer %d must be [name, *args], got %r" % (i, spec))
        cls = getattr(mf, spec[0], None)
        if cls is None or not hasattr(cls, "forward"):
            raise ValueError("build_layers: layer %d: unknown layer %r (microformer has no such class)"
                             % (i, spec[0]))
        args = list(spec[1:])
        kw = args.pop() if args and isinstance(args[-1], dict) else {}
        args = [tuple(a) if isinstance(a, list) else a for a in args]
        out.append(cls(*args, **kw))
    return mf.Sequential(out)


def drift(features, scale=DRIFT_SCALE, offset=DRIFT_OFFSET):
    """What the drifted sensor reads for true `features`: x * scale + offset per feature."""
    return [features[j] * scale[j] + offset[j] for j in range(len(features))]


def _fmt(v):
    s = "%.6g" % v
    return s


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
        layers = meta.get("layers")
        if layers is None and meta.get("arch") == "iris-attention-v1":
            layers = IRIS_LAYERS
        if layers is None:
            raise checkpoint.CheckpointError("checkpoint %r: metadata lacks 'layers' (the model's layer "
                                             "list)" % self.checkpoint_path)
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
        self.model = build_layers(layers, meta.get("init_seed", 1))
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
        self._user_X = array("f")
        self._user_y = []
        try:
            os.stat(self.user_path)
            have = True
        except OSError:
            have = False
        if have:        # the same reader: a bad line is an error naming the file, line and column
            X, y, _, _ = self._read(self.user_path)
            self._user_X = X
            self._user_y = y
        self._say("%s: %s, %d params, classes %s; base %d rows, user %d examples; backend %s"
                  % (self.checkpoint_path, meta.get("arch", "model"), self.model.param_count(),
                     ", ".join(self.classes), len(self._base) if self._base else 0,
                     len(self._user_y), mf.get_backend()))

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
            return self._user_X, self._user_y
        if self._base is None:
            raise ValueError("Session: no base data (%s missing); use data='user' or a list"
                             % self.data_path)
        F = self.num_features
        X, y = self._base.X.data, self._base.y
        if which == "base":
            return X, y
        if which == "all":
            return X + self._user_X, y + self._user_y
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
        return len(self._user_y)

    def add_example(self, features, label):
        """Append one labelled reading (raw units) to the user data file and to this session."""
        return self.add_examples([(features, label)], "add_example")

    def add_examples(self, pairs, who="add_examples"):
        """Append (features, label) pairs (raw units); checked first, then written in one go."""
        if not isinstance(pairs, (list, tuple)):
            raise ValueError("%s: expected a list of (features, label) pairs, got %r" % (who, pairs))
        lines = []
        for k in range(len(pairs)):
            pair = pairs[k]
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError("%s: expected (features, label), got %r" % (who, pair))
            x = self._check_features(pair[0], who, None if who == "add_example" else k)
            c = self._check_label(pair[1], who)
            lines.append(",".join(_fmt(v) for v in x) + "," + self.classes[c])
        new = True
        try:
            new = os.stat(self.user_path)[6] == 0
        except OSError:
            d = self.user_path.rsplit("/", 1)[0] if "/" in self.user_path else ""
            if d:
                try:
                    os.mkdir(d)
                except OSError:
                    pass
        with open(self.user_path, "a") as f:
            if new:
                f.write(",".join(self.features) + ",label\n")
            for line in lines:
                f.write(line + "\n")
        # what the file now says is what this session holds (a new Session reads the same)
        for line in lines:
            parts = line.split(",")
            self._user_X.extend(array("f", [float(p) for p in parts[:-1]]))
            self._user_y.append(self.classes.index(parts[-1]))
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        self._say("%d user example%s in %s" % (len(self._user_y), "" if len(self._user_y) == 1 else "s",
                                               self.user_path))
        return len(self._user_y)

    def clear_examples(self):
        """Forget the user examples; the user data file is kept as a backup (user.csv.bak, then
        .bak2, ...), never deleted. Returns the backup's path (None if there was no file)."""
        n = len(self._user_y)
        kept = None
        if _exists(self.user_path):
            kept = _backup_path(self.user_path)
            os.rename(self.user_path, kept)
        self._user_X = array("f")
        self._user_y = []
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        if kept:
            self._say("user examples cleared: %d example%s moved to %s (to restore: "
                      "os.rename(%r, %r))" % (n, "" if n == 1 else "s", kept, kept, self.user_path))
        else:
            self._say("no user examples to clear (%s does not exist)" % self.user_path)
        return kept

    def drifted_examples(self, n=None, part="train", scale=DRIFT_SCALE, offset=DRIFT_OFFSET, seed=0):
        """(features, label) pairs as the drifted sensor reads base rows (raw units).

        part: 'train', 'test' or 'base' rows; n: how many (None: all), picked with `seed`
        and balanced over the classes.
        """
        if part not in ("train", "test", "base"):
            raise ValueError("drifted_examples: part must be 'train', 'test' or 'base', got %r" % (part,))
        if len(scale) != self.num_features or len(offset) != self.num_features:
            raise ValueError("drifted_examples: scale and offset need %d values each" % self.num_features)
        X, y = self._raw(part)
        F = self.num_features
        order = list(range(len(y)))
        if n is not None:
            if not isinstance(n, int) or not 0 < n <= len(y):
                raise ValueError("drifted_examples: n must be an int in 1..%d, got %r" % (len(y), n))
            Rng(seed + 1).shuffle(order)
            per = [[i for i in order if y[i] == c] for c in range(len(self.classes))]
            order = []
            k = 0
            while len(order) < n:                   # round robin over the classes
                for c in range(len(per)):
                    if k < len(per[c]) and len(order) < n:
                        order.append(per[c][k])
                k += 1
        out = []
        for i in order:
            raw = [X[i * F + j] for j in range(F)]
            out.append(([float(_fmt(v)) for v in drift(raw, scale, offset)], self.classes[y[i]]))
        return out

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

    def fit(self, epochs=FIT_EPOCHS, data=None, lr=None, verbose=None):
        """Fine-tune; one line per epoch (loss, acc, ms/step, free heap). Returns the history.

        data: None ('user' if there are user examples, else 'train'), a selection name or a
        list of (features, label) pairs. Ctrl-C stops after the current step; the model keeps
        the weights of the last full step.
        """
        if data is None:
            data = "user" if self._user_y else "train"
        name, ds = self._select(data, "fit")
        if lr is not None:
            self.lr = hyper("fit", "lr", lr, 0.0, None, True)
            if self._opt is not None:
                self._opt.lr = self.lr
        if self._opt is None:
            if not self.model.collect_params([]):
                raise ValueError("fit: every layer is frozen; unfreeze something first (s.unfreeze())")
            self._opt = mf.Adam(self.model, lr=self.lr)
        verbose = self.verbose if verbose is None else verbose
        if verbose:
            print("fit on %s: %d examples, %d epochs, batch %d, lr %g; %s"
                  % (name, len(ds), epochs, min(self.batch_size, len(ds)), self.lr,
                     self.trainable_summary()))
        t0 = _ms()
        hist = []
        steps0 = self._opt.steps
        self._fits += 1
        try:
            hist = _fit(self.model, self._loss, self._opt, ds, epochs=epochs,
                        batch_size=min(self.batch_size, len(ds)), seed=self._fits, verbose=verbose)
        except KeyboardInterrupt:
            # between steps (train.fit catches it inside one); no update is ever half done
            hist = hist or [{"interrupted": True}]
            hist[-1]["interrupted"] = True
        except MemoryError:
            raise self._oom("in fit (batch %d)" % min(self.batch_size, len(ds)))
        finally:
            self.model.train()
        seconds = (_ms() - t0) / 1000
        steps = self._opt.steps - steps0
        interrupted = bool(hist and hist[-1].get("interrupted"))
        rec = {"data": name, "n": len(ds), "epochs": len([h for h in hist if h.get("steps")]),
               "steps": steps, "lr": self.lr, "seconds": seconds, "interrupted": interrupted,
               "loss": hist[-1].get("loss") if hist else None,
               "frozen": [i for i in range(len(self.model.layers)) if not self.model.layers[i].trainable]}
        self.meta.setdefault("history", []).append(rec)
        if verbose:
            if interrupted:
                print("interrupted: stopped after %d full steps; the model keeps the weights of the last "
                      "full step (s.save() keeps them, a new Session() drops them)" % steps)
            print("fit: %d steps in %.1f s" % (steps, seconds))
        return hist

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
        out = {"accuracy": acc, "correct": correct, "n": len(ds), "per_class": per,
               "confusion": confusion, "data": name}
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
        return label, probs

    def save(self, path=None):
        """Write the checkpoint atomically (default: the one this session loaded)."""
        path = self._path(path) if path else self.checkpoint_path
        self.meta["user_examples"] = len(self._user_y)
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
              % (m.get("train_acc"), m.get("test_acc"), len(m.get("history", []))))
        print("base data %s (%d rows); user data %s (%d examples)"
              % (self.data_path, len(self._base) if self._base else 0, self.user_path, len(self._user_y)))
        print(self.trainable_summary())
        print("memory for a batch of %d: %d bytes (free heap %s)"
              % (self.batch_size, self.need["total_bytes"], _mem_free()))

    def __repr__(self):
        return "<finetune.Session %s: %d user examples>" % (self.checkpoint_path, len(self._user_y))


def _exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _backup_path(path):
    """The first free name of PATH.bak, PATH.bak2, PATH.bak3, ... (a board may have no clock)."""
    k = path + ".bak"
    i = 2
    while _exists(k):
        k = "%s.bak%d" % (path, i)
        i += 1
    return k


def _join(root, p):
    if not root or p.startswith("/"):
        return p
    return root.rstrip("/") + "/" + p


def _copy(src, dst):
    buf = bytearray(512)
    mv = memoryview(buf)
    with open(src, "rb") as f, open(dst, "wb") as g:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            g.write(mv[:n])


def demo_session(fresh=True, root=None, verbose=True):
    """A Session on the demo's own files in DEMO_DIR: its checkpoint and its examples.

    fresh=True starts over: DEMO_DIR/iris.mfck becomes a copy of DEMO_DIR/pretrained.mfck (what
    `make demo` copies there; without it, of the main checkpoint, which is only read) and the
    demo's own examples are dropped. The base data is shared and only read. Nothing outside
    DEMO_DIR is written.
    """
    d = _join(root, DEMO_DIR)
    ck = d + "/" + CHECKPOINT
    user = d + "/user.csv"
    if fresh:
        if not _exists(d):
            os.mkdir(d)
        src = d + "/" + DEMO_PRETRAINED
        if not _exists(src):
            src = _join(root, CHECKPOINT)
            if not _exists(src):
                raise OSError(2, "demo: no checkpoint to start from: neither %s/%s nor %s (`make "
                              "demo` or `make deploy` copies one)" % (d, DEMO_PRETRAINED, src))
        _copy(src, ck)
        if _exists(user):
            os.remove(user)                  # the demo's own examples from its previous run
    return Session(checkpoint=ck, data=_join(root, DATA), user_data=user, verbose=verbose)


def demo(root=None, n=24, epochs=FIT_EPOCHS, seed=0):
    """The drift story in one call, in the demo's own folder (DEMO_DIR; your checkpoint and
    examples are not touched): before, add drifted examples, fit, after, save, reload."""
    s = demo_session(root=root)
    held = s.drifted_examples(part="test")
    before = s.evaluate(held)["accuracy"]
    s.add_examples(s.drifted_examples(n, seed=seed))
    s.freeze(*FREEZE)
    t0 = _ms()
    s.fit(epochs=epochs)
    seconds = (_ms() - t0) / 1000
    after = s.evaluate(held)["accuracy"]
    s.save()
    s2 = demo_session(fresh=False, root=root, verbose=False)
    again = s2.evaluate(held, verbose=False)["accuracy"]
    print("drift demo: accuracy %.1f%% before, %.1f%% after %d epochs on %d examples (%.1f s); "
          "reloaded: %.1f%%" % (100 * before, 100 * after, epochs, n, seconds, 100 * again))
    return {"before": before, "after": after, "reloaded": again, "seconds": seconds,
            "base_test": s2.evaluate("test", verbose=False)["accuracy"]}
