# mf_extra.py: the Session commands a session that loads, fits and evaluates does not need:
# user examples (add, clear, lists of pairs), the model's parts and freezing, predict, save,
# info, help and regression's evaluate. mf_session's Session methods call these functions (the
# session is their `self`) and import this module on first use, so a plain fine-tune keeps
# their code off the heap (a board without PSRAM has a small one).
from array import array
from math import exp, sqrt

from microformer import checkpoint
from microformer.data import Batches
from microformer.finite import float32_row
from microformer.tensor import Tensor

from mf_examples import ALIASES, KINDS, SELECTIONS, Result, _is_number, _mem_free, _n, fmt


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


def _glob(pat, s):
    """fnmatch for '*' (any run, dots included) and '?' (one character)."""
    if not pat:
        return not s
    c = pat[0]
    if c == "*":
        for i in range(len(s) + 1):
            if _glob(pat[1:], s[i:]):
                return True
        return False
    return bool(s) and (c == "?" or c == s[0]) and _glob(pat[1:], s[1:])


def _fit_count(meta):
    """How many fits the checkpoint has seen (meta['history'] keeps only the last few)."""
    tot = meta.get("fit_totals")
    if isinstance(tot, dict) and isinstance(tot.get("fits"), int):
        return tot["fits"]
    return len(meta.get("history") or [])


def _check_features(self, x, who, index=None):
    # one example (raw units) -> list of floats; NaN / inf (as float32: 1e39 too) refused. A
    # window: L*C numbers time-major, or L readings of C numbers (flattened here)
    n = self.num_features
    at = "" if index is None else "example %d: " % index
    if len(self.input_shape) == 2 and isinstance(x, (list, tuple)) and x and \
            isinstance(x[0], (list, tuple)):
        L, C = self.input_shape
        if len(x) != L:
            raise ValueError("%s: %sexpected a window of %d readings of %d numbers (%s), got %d readings"
                             % (who, at, L, C, ", ".join(self.features), len(x)))
        flat = []
        for t in range(L):
            r = x[t]
            if not isinstance(r, (list, tuple)) or len(r) != C:
                raise ValueError("%s: %sreading %d must be %d numbers (%s), got %r"
                                 % (who, at, t, C, ", ".join(self.features), r))
            flat.extend(r)
        x = flat
    if not isinstance(x, (list, tuple)) or len(x) != n:
        if len(self.input_shape) == 2:
            raise ValueError("%s: %sexpected a window of %d readings x %d channels (%s): %d numbers "
                             "time-major or a list of %d readings, got %s"
                             % (who, at, self.input_shape[0], self.input_shape[1], ", ".join(self.features),
                                n, self.input_shape[0], ("%d numbers" % len(x)) if isinstance(x, (list, tuple))
                                else repr(x)))
        raise ValueError("%s: %sexpected %d features (%s), got %r"
                         % (who, at, n, ", ".join(self.features), x))
    cols = self.columns
    for j in range(n):
        if not isinstance(x[j], (int, float)) or isinstance(x[j], bool):
            raise ValueError("%s: %sfeature %d (%s) must be a number, got %r"
                             % (who, "" if index is None else "example %d, " % index, j + 1,
                                cols[j], x[j]))
    x = [float(v) for v in x]
    float32_row(who, x, cols, index)
    return x


def _check_label(self, label, who, index=None):
    if self.task == "regress":
        T = len(self.targets)
        v = label if isinstance(label, (list, tuple)) else [label]
        if len(v) != T or not all(_is_number(t) for t in v):
            raise ValueError("%s: %sthe target must be %s (%s), got %r"
                             % (who, "" if index is None else "example %d: " % index,
                                "a number" if T == 1 else "%d numbers" % T, ", ".join(self.targets), label))
        v = [float(t) for t in v]
        float32_row(who, v, self.targets, index)
        return tuple(v)
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(self.classes):
        return label
    if label in self.classes:
        return self.classes.index(label)
    raise ValueError("%s: unknown label %r (expected one of %s)"
                     % (who, label, ", ".join(self.classes)))


def add_examples(self, pairs, who="add_examples"):
    """Append (features, label) pairs (raw units); checked first, then written in one go."""
    if not isinstance(pairs, (list, tuple)):
        raise ValueError("%s: expected a list of (features, label) pairs, got %r" % (who, pairs))
    rows = []
    k = None
    for k in range(len(pairs)):
        pair = pairs[k]
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError("%s: expected (features, label), got %r" % (who, pair))
        i = None if who == "add_example" else k
        x = _check_features(self, pair[0], who, i)
        c = _check_label(self, pair[1], who, i)
        if self.task == "regress":
            # the file's form: the numbers, the targets but the last, and the last as the label
            x = x + list(c[:-1])
            text = fmt(c[-1])
            if text not in self._labels:
                self._labels.append(text)
            c = self._labels.index(text)
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


def parts(self, verbose=None):
    """The model's parameters as freeze/unfreeze name them: [(name, shape, kinds, frozen)];
    prints one line each."""
    out = []
    for p in self._parts:
        out.append((p.name, p.shape(), list(p.kinds), p.name in self._frozen))
    if self.verbose if verbose is None else verbose:
        for name, shape, kinds, frozen in out:
            print("%-36s %-12s %s%s" % (name, "x".join(str(d) for d in shape), " ".join(kinds),
                                        "  (frozen)" if frozen else ""))
    return out


def _valid_parts(self):
    have = []
    for k in KINDS:
        if k == "all" or any(k in p.kinds for p in self._parts):
            have.append(k)
    return ("kinds %s; a layer index 0..%d; a name, a prefix or a glob of %s"
            % (", ".join(repr(k) for k in have), len(self.model.layers) - 1,
               ", ".join(p.name for p in self._parts)))


def _select_parts(self, part, who):
    # [Part] a part names; ValueError listing the valid names when it names none
    P = self._parts
    L = self.model.layers
    if isinstance(part, int) and not isinstance(part, bool):
        if not -len(L) <= part < len(L):
            raise ValueError("%s: layer index %d out of range (the model has layers 0..%d)"
                             % (who, part, len(L) - 1))
        i = part % len(L)
        got = [p for p in P if p.top == i]
        if not got:
            raise ValueError("%s: layer %d (%s) has no parameters; layers with parameters: %s"
                             % (who, i, type(L[i]).__name__,
                                ", ".join(sorted(set("%d %s" % (p.top, type(L[p.top]).__name__) for p in P)))))
        return got
    if not isinstance(part, str) or not part:
        raise ValueError("%s: a part must be a str or a layer index, got %r; valid: %s"
                         % (who, part, _valid_parts(self)))
    kind = ALIASES.get(part, part)
    if kind == "all":
        return list(P)
    if kind in KINDS:
        got = [p for p in P if kind in p.kinds]
        if not got:
            raise ValueError("%s: this model has no %r parameters; valid: %s" % (who, part, _valid_parts(self)))
        return got
    if "*" in part or "?" in part:
        got = [p for p in P if _glob(part, p.name)]
    else:
        got = [p for p in P if p.name == part or p.name.startswith(part + ".")]
    if not got:
        raise ValueError("%s: unknown part %r; valid: %s" % (who, part, _valid_parts(self)))
    return got


def _set_trainable(self, parts, flag, who):
    if not parts:
        parts = ("all",)
    chosen = []
    for part in parts:                   # check every part before changing any
        for p in _select_parts(self, part, who):
            if p not in chosen:
                chosen.append(p)
    changed = [p for p in chosen if (p.name in self._frozen) == flag]
    for p in changed:
        if flag:
            del self._frozen[p.name]
        else:
            self._frozen[p.name] = 1
    _apply_frozen(self)
    if self.verbose:
        n = 0
        for p in changed:
            n += p.size
        print("%s %s (%d params)%s" % (who, _n(len(changed), "parameter"), n,
                                       ": " + ", ".join("%s %s" % (p.name, "x".join(str(d) for d in p.shape()))
                                                        for p in changed) if changed else
                                       " (already %s)" % ("trainable" if flag else "frozen")))
        print(self.trainable_summary())
    return [p.name for p in changed]


def _apply_frozen(self):
    # a layer all of whose parameters are frozen is frozen itself (trainable = False: no weight
    # grads at all); in a partly frozen layer the frozen tensors still get their gradient
    # computed, and the optimizer leaves them out
    ids = {}
    for p in self._parts:
        if p.name in self._frozen:
            for t in p.tensors:
                ids[id(t)] = 1
    layers = []
    for p in self._parts:
        if p.layer not in layers:
            layers.append(p.layer)
    for layer in layers:
        mine = [q for q, _ in layer.params()]
        layer.trainable = not all(id(q) in ids for q in mine)
        if layer.trainable and self._adapter_ids and any(id(q) in self._adapter_ids for q in mine):
            # an adapted layer: its frozen base holds no grad buffer (LoRA's memory saving)
            from microformer.layer import changed, release_grad
            for q, g in layer.params():
                if id(q) in ids:
                    release_grad(g)
            changed()
    self._make_net(ids)                  # the optimizer's parameter list changes: a new trainer


def _evaluate_regress(self, name, ds, verbose):
    T = len(self.targets)
    sq = [0.0] * T
    ab = [0.0] * T
    try:
        for X, y in Batches(ds, self.batch_size):
            d = self._trainer.logits(X).data
            for b in range(len(y)):
                for k in range(T):
                    e = d[b * T + k] - y[b][k]
                    sq[k] += e * e
                    ab[k] += abs(e)
    except MemoryError:
        raise self._oom("in evaluate")
    finally:
        self.model.train()
    n = len(ds)
    rmse = [sqrt(v / n) for v in sq]
    mae = [v / n for v in ab]
    text = ", ".join("%s RMSE %.4g MAE %.4g" % (self.targets[k], rmse[k], mae[k]) for k in range(T))
    if self.verbose if verbose is None else verbose:
        print("%s on %s (%s)" % (text, name, _n(n, "example")))
    return Result("<%s on %s (%d)>" % (text, name, n),
                  {"rmse": rmse, "mae": mae, "n": n, "data": name, "targets": list(self.targets)})


def _forward_one(self, features, who):
    x = _check_features(self, features, who)
    n = self.num_features
    C = self.channels
    X = Tensor((1, n))
    for j in range(n):
        X.data[j] = (x[j] - self.mean[j % C]) / self.std[j % C]
    return self._trainer.logits(X).data


def predict(self, features, verbose=None):
    """(label, [probability per class]) for one example in raw units; for a regression model
    a result whose .values are the predicted targets."""
    out = _forward_one(self, features, "predict")
    verbose = self.verbose if verbose is None else verbose
    if self.task == "regress":
        values = [out[k] for k in range(len(self.targets))]
        text = ", ".join("%s %.4g" % (self.targets[k], values[k]) for k in range(len(values)))
        if verbose:
            print(text)
        return Result("<%s>" % text, {"values": values, "targets": list(self.targets)})
    logits = out
    m = max(logits)
    e = [exp(v - m) for v in logits]
    s = sum(e)
    probs = [v / s for v in e]
    best = probs.index(max(probs))        # the first on ties
    label = self.classes[best]
    if verbose:
        print("%s  (%s)" % (label, ", ".join("%s %.3f" % (self.classes[c], probs[c])
                                             for c in range(len(probs)))))
    return Prediction("<%s %.3f>" % (label, probs[best]), {"label": label, "probs": probs})


def save(self, path=None):
    """Write the checkpoint atomically (default: the one this session loaded)."""
    if path is not None and not (isinstance(path, str) and path):
        raise ValueError("save: path must be a file name (a non-empty str) or None, got %r" % (path,))
    path = self._path(path) if path else self.checkpoint_path
    self.meta["user_examples"] = len(self._examples.y)
    n = checkpoint.save(path, self.model, self.meta)
    if path == self.checkpoint_path:
        self._dirty = False
    self._say("saved %s (%d bytes)" % (path, n))
    return n


def info(self):
    """Print what this session holds."""
    m = self.meta
    print("checkpoint %s: %s, %d params; %s %s; input %s"
          % (self.checkpoint_path, m.get("arch", "model"), self.model.param_count(),
             "classes" if self.task == "classify" else "regression of", ", ".join(self.outputs),
             self._input_text()))
    print("pretrained: train %s, test %s; on-board fits: %d"
          % (m.get("train_acc"), m.get("test_acc"), _fit_count(m)))
    print("base data %s (%d rows); user data %s (%d examples)"
          % (self.data_path, len(self._base[1]) if self._base else 0, self.user_path, len(self._examples.y)))
    print(self.trainable_summary())
    print("memory for a batch of %d: %d bytes (free heap %s)"
          % (self.batch_size, self.need["total_bytes"], _mem_free()))

def select_list(self, data, who):
    # Session._select for a list of (features, label) pairs: (name, standardized data set)
    if not isinstance(data, (list, tuple)) or not data:
        raise ValueError("%s: data must be one of %s or a non-empty list of (features, label) pairs"
                         % (who, ", ".join(repr(s) for s in SELECTIONS)))
    X = array("f")
    y = []
    for k, pair in enumerate(data):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError("%s: item %d must be a (features, label) pair, got %r" % (who, k, pair))
        X.extend(array("f", _check_features(self, pair[0], who, k)))
        y.append(_check_label(self, pair[1], who, k))
    return "list of %d" % len(y), self._standardized(X, y)
