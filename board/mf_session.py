# mf_session.py: finetune.Session, a model loaded from flash with its data, ready to evaluate,
# predict and fine-tune (MicroPython or CPython). The REPL entry point is finetune.py.
# Everything about the model comes from the checkpoint: the model from its spec, the task,
# classes / targets, input shape and standardization from its metadata (microformer.meta
# checks them), the names of its parts from the model itself (state_dict names).
import gc
import os
import sys
from array import array

import microformer as mf
from microformer.data import Dataset
from microformer.finite import hyper
from microformer.lazy import adopt, stub
from microformer.tensor import Tensor, shape_size
from microformer.train import Trainer, duration

from mf_examples import SELECTIONS, Examples, Result, _mem_free, _n, exists, foreign, user_data_for  # noqa: F401


def _commands():
    # mf_commands: the objects behind the commands a session that loads, fits and evaluates does
    # not need (example checks, predict, help, ...), imported on first use to keep the start small
    try:
        import mf_commands
    except ImportError as e:      # the text says what failed: MicroPython keeps no chained cause
        raise ImportError("mf_commands (the session's commands beyond fit and evaluate) failed to import: %s" % e)
    return mf_commands


def __getattr__(name):
    # mf_session.SESSION_HELP, kept in mf_commands
    if name == "SESSION_HELP":
        return _commands().SESSION_HELP
    raise AttributeError("module 'mf_session' has no attribute '%s'" % name)


CHECKPOINT = "model.mfck"          # what `make deploy CHECKPOINT=path` writes on the board
DATA_DIR = "data"                  # base data: DATA_DIR/<meta['data']>
USER_DATA = "data/user.csv"       # model.mfck's examples; another checkpoint's: mf_examples.user_data_for
FIT_EPOCHS = 10
FIT_LR = 0.02


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


# Reading the checkpoint and the data files leaves garbage among what the session keeps: Session()
# collects meanwhile, every LOAD_GC_SHARE-th of the heap allocated, at most every LOAD_GC_BYTES
# (a collection's cost grows with the heap: a small heap collects often and cheaply, a PSRAM
# heap as before). On the 32-bit port the Iris session then ran from a 4 KB smaller heap than
# with every 32 KB (216 KB instead of 220 KB), and loading took about twice as long there;
# every 32 KB had gained 10 KB over no collections.
LOAD_GC_BYTES = 32768
LOAD_GC_SHARE = 16
_threshold = getattr(gc, "threshold", None)          # MicroPython; CPython has no such heap
# Modules only loading needs, functions and constants only (no classes): microformer.spec (the
# model from its spec), specformat, and specplan (the checkpoint's check of what its spec would
# allocate, before anything is built), microformer.csvfile (the CSV reader: the data files,
# the user's examples) and mf_load (the session's own load-only methods: the model's input,
# reading the data files, the split). On MicroPython, Session() drops those its load imported
# as soon as it is past them (specplan once the spec is checked, the others once the checkpoint's
# weights are read, all of them when the load fails), before the model's weights are read and
# the data files: their code's heap goes back to the data and the fit; whatever needs them later
# (s.lora, s.save) imports them again. CPython keeps them.
LOAD_ONLY = ("microformer.spec", "microformer.specformat", "microformer.specplan", "microformer.csvfile",
             "mf_load")
# Modules only loading needs that define an exception class: microformer.checkpoint (the file's
# reader; s.save imports it again), dropped the same way once the weights are read, never when
# that part fails: the error it raises stays an instance of the class `except mf.CheckpointError`
# names. microformer.meta (the metadata's checks, imported by the load too) goes once the whole
# load has succeeded, as its MetaError stays the class `except microformer.meta.MetaError` names;
# the session keeps the train/test split, so fit needs no meta (the 32-bit Iris session, modules
# compiled to .mpy, then ran from 220 KB instead of 232 KB).
LOAD_ONLY_AFTER = ("microformer.checkpoint", "microformer.meta")
# The memory plan (microformer.memplan), which fit imports to choose its micro-batch: dropped
# again before the first step on MicroPython when that fit loaded it (its code's heap goes to the
# step's buffers); a plan asked for later (s.plan(), an out-of-memory message) imports it again.
FIT_ONLY = ("microformer.memplan",)


def _drop(names):
    # forget modules: sys.modules and the package's attribute hold the only references
    for full in names:
        if sys.modules.pop(full, None) is not None:
            pkg, _, attr = full.rpartition(".")
            owner = sys.modules.get(pkg)
            if owner is not None:
                owner.__dict__.pop(attr, None)


class _Regression:
    """A regression data set for train.fit: X [N, n] standardized inputs, y N tuples of targets."""

    def __init__(self, X, y):
        self.X = X
        self.y = y

    def __len__(self):
        return len(self.y)


class _MSE:
    """MSELoss over the targets of a batch of _Regression examples (train.fit gives the loss the
    batch's y: here tuples of numbers, copied into one reused Tensor per batch size)."""
    classifies = False      # train.fit: no accuracy to count

    def __init__(self, T):
        self.T = T
        self._mse = mf.MSELoss()
        self._t = {}

    def forward(self, pred, y):
        T = self.T
        B = len(y)
        t = self._t.get(B)
        if t is None:
            t = self._t[B] = Tensor((B, T))
        d = t.data
        for b in range(B):
            row = y[b]
            for k in range(T):
                d[b * T + k] = row[k]
        return self._mse.forward(pred, t)

    def backward(self):
        return self._mse.backward()


def _fit_args(epochs, lr, verbose, on_error):
    # Session.fit's arguments, checked before anything changes; returns lr (checked) or None
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
    return lr

def _data_oom(path):
    # a data file whose rows do not fit in the heap beside the model
    gc.collect()
    try:
        size = "%d bytes" % os.stat(path)[6]
    except OSError:
        size = "size unknown"
    return MemoryError("Session: out of memory reading %s (%s): its rows do not fit in the heap beside "
                       "the model (free heap %s bytes); move rows out of it (mpremote cp, then edit) "
                       "and start a new Session" % (path, size, _mem_free()))


def _methods():
    # mf_methods (the commands a session that loads, fits and evaluates never runs), imported now
    # if it is not yet; its functions become Session's methods. Returns its class Methods
    try:
        import mf_methods
    except ImportError as e:      # the text says what failed: MicroPython keeps no chained cause
        raise ImportError("mf_methods (the session's rarer commands) failed to import: %s" % e)
    return adopt(Session, mf_methods.Methods, mf_methods.METHODS)


class Session:
    """A model loaded from flash with its data, ready to evaluate, predict and fine-tune.

    Session(checkpoint='model.mfck', data=None, user_data=None, lr=FIT_LR,
            batch_size=16, root=None, backend=None, verbose=True, adapter=None)
    data: the base data file (None: data/<meta['data']> when the checkpoint's metadata names
    one, else none). user_data: the file of your examples (None: the checkpoint's own:
    data/user.csv for model.mfck, data/NAME.user.csv for NAME.mfck). root: a folder the paths are relative to (None: the cwd, '/' on the board).
    backend: 'python' or 'viper' (None: the interpreter's default, viper on MicroPython, whatever
      an earlier set_backend chose; the session's first line names it and says why it is the
      one: microformer.backend.why).
    adapter: an adapter file (s.save_adapter) to load on top of the checkpoint, which must be
    the base it was saved for.
    """

    def __init__(self, checkpoint=CHECKPOINT, data=None, user_data=None, lr=FIT_LR,
                 batch_size=16, root=None, backend=None, verbose=True, adapter=None):
        for what, v, none_ok in (("checkpoint", checkpoint, False), ("data", data, True),
                                 ("user_data", user_data, True), ("root", root, True),
                                 ("adapter", adapter, True)):
            if not (isinstance(v, str) and v) and not (none_ok and v is None):
                raise ValueError("Session: %s must be a file name (a non-empty str)%s, got %r"
                                 % (what, " or None" if none_ok else "", v))
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError("Session: batch_size must be a positive int, got %r" % (batch_size,))
        lr = hyper("Session", "lr", lr, 0.0, None, True)
        # the session's backend: the one asked for, else the interpreter's default, never one an
        # earlier set_backend left behind (in a REPL kept with `mpremote resume`); said if so
        self._backend_note = ""
        before = (mf.get_backend(), mf.backend.why)    # put back if this session fails to start
        if backend:
            mf.set_backend(backend)
        else:
            mf.backend.use_default()
            if before[0] != mf.get_backend():
                self._backend_note = ("; %r, set before this session, is not kept: Session(backend=%r) "
                                      "keeps it" % (before[0], before[0]))
        self._backend = (mf.get_backend(), mf.backend.why)
        self.root = root
        self.checkpoint_path = self._path(checkpoint)
        self._data_arg = data
        self.data_path = None
        if user_data is None:
            user_data = user_data_for(checkpoint)
        self.user_path = self._path(user_data)
        self.lr = float(lr)
        self.batch_size = batch_size
        self.verbose = verbose
        self.model = None
        self.need = None
        self._fits = 0
        self._cache = {}
        self._frozen = {}                     # {name: 1} of the frozen parameters
        self._parts = None                    # microformer.parts' Parts, made on first use
        self._inputs = None                   # mf_commands.Inputs, made on first use
        self._adapter_ids = {}                # ids of the LoRA tensors (s.lora, s.load_adapter)
        self._dirty = False                   # base weights fitted since the checkpoint was read
        old = _threshold() if _threshold else None
        self._reading = self.checkpoint_path    # the file a MemoryError while loading is about
        loaded = [m for m in LOAD_ONLY if m not in sys.modules] if _threshold else []    # this load's, dropped
        after = [m for m in LOAD_ONLY_AFTER if m not in sys.modules] if _threshold else []
        try:
            if _threshold:
                _threshold(min(LOAD_GC_BYTES, (gc.mem_alloc() + gc.mem_free()) // LOAD_GC_SHARE))
            self._load(loaded, after)
            if adapter is not None:
                self._reading = self._path(adapter)
                self.load_adapter(adapter)
        except MemoryError:
            self._cache = {}
            mf.set_backend(*before)
            if self._reading != self.checkpoint_path and not self._reading.endswith(".mfck"):
                raise _data_oom(self._reading)
            raise self._oom("loading %s" % self._reading)
        except BaseException:
            mf.set_backend(*before)
            raise
        finally:
            if _threshold:
                _threshold(old)
            _drop(loaded)

    def _own_backend(self):
        # this session's backend, also after another session (or set_backend) chose another one
        if mf.get_backend() != self._backend[0]:
            mf.set_backend(*self._backend)

    def help(self):
        """Print the session's commands (mf_commands.SESSION_HELP)."""
        print(_commands().SESSION_HELP)

    def _path(self, p):
        if not self.root or p.startswith("/"):
            return p
        return self.root.rstrip("/") + "/" + p

    def _say(self, s):
        if self.verbose:
            print(s)

    # ---- loading ------------------------------------------------------------------------

    def _load(self, loaded, after):
        # loaded, after: the modules of LOAD_ONLY and LOAD_ONLY_AFTER this load imports (dropped
        # once it is past them; on MicroPython, else empty)
        path = self.checkpoint_path
        if not (exists(path) or exists(path + ".tmp")):
            raise _commands().missing(path, CHECKPOINT)
        from mf_load import Load                        # LOAD_ONLY
        from microformer import checkpoint              # LOAD_ONLY_AFTER
        head = checkpoint.read_header(path)   # CheckpointError names the file
        from microformer import meta as _meta           # after the header: not beside specplan's peak
        where = "checkpoint %r" % path
        meta = head["meta"]
        # what a session needs, checked in one place (microformer.meta); notes: the defaults
        m, notes = _meta.check(meta, where)
        # the model comes from meta['spec']; checkpoints older than specs: from meta['layers'] or
        # arch 'iris-attention-v1' (spec_of says which), and save() then writes the spec
        spec = checkpoint.spec_of(meta, where)
        _drop([m for m in loaded if m.endswith(".specplan")])     # the spec is checked: no more plans
        self.meta = meta
        self.task = m["task"]
        self.classes = list(m["classes"]) if self.task == "classify" else []
        self.targets = list(m["targets"]) if self.task == "regress" else []
        self.outputs = self.classes or self.targets
        self.input_shape = list(m["input_shape"])
        self.features = list(m["features"])
        self.mean = m["mean"]
        self.std = m["std"]
        self.channels = len(self.mean)
        self.num_features = shape_size(self.input_shape)     # numbers per example (L*C for a window)
        if len(self.input_shape) == 2:
            self.columns = ["t%d_%s" % (t, f) for t in range(self.input_shape[0]) for f in self.features]
        else:
            self.columns = list(self.features)
        self._params_in_file = 0
        for _, shape in head["tensors"]:
            self._params_in_file += shape_size(shape)
        mf.seed(meta.get("init_seed", 1))
        from microformer.spec import from_spec      # a module only loading needs: LOAD_ONLY
        self.model = from_spec(spec)
        self._shape, self.need = Load.model_input(self, where)
        checkpoint.load(path, self.model)     # verified before any weight changes
        _drop(loaded + [m for m in after if m.endswith(".checkpoint")])    # no CheckpointError from here on
        del checkpoint, from_spec, spec, head   # nothing here holds them: their heap goes back now
        self._labels = []                     # regression: the last target's texts in the files
        self._loss = mf.CrossEntropyLoss() if self.task == "classify" else _MSE(len(self.targets))
        self._make_net()
        self._base = None
        data = self._data_arg
        if data is None and m.get("data"):
            data = DATA_DIR + "/" + m["data"]
        if data is None:
            notes.append("base data: none (the metadata names no 'data' file; Session(data=...) "
                          "names one): 'train' / 'test' need it, 'user' and lists work")
        else:
            self.data_path = self._path(data)
            if not exists(self.data_path):
                notes.append("base data: none, %s does not exist (evaluate/fit need 'user' or a list)"
                             % self.data_path)
            else:
                X, y = Load.read(self, self.data_path)
                if y:
                    self._base = (X, y)
                    m = _meta.check(meta, where, len(y))[0]      # n_train within the rows
                else:
                    notes.append("base data: %s holds no rows" % self.data_path)
        self._m = m
        self._split = None
        if self._base and "n_train" not in meta and "split" not in meta:
            # no split given: the board chooses one, once, and the checkpoint keeps it (s.save())
            rows = len(self._base[1])
            test = sorted(Load.split_idx(self, _meta)[1])
            meta["split"] = m["split"] = {"test": test}
            for i in range(len(notes)):
                if notes[i].startswith("n_train"):
                    notes[i] = _commands().split_note(len(test), rows, self.data_path,
                                                      100 - int(100 * _meta.TRAIN_FRACTION), m["split_seed"])
        if self._base:
            self._split = Load.split_idx(self, _meta)   # (train rows, test rows): fit needs no meta
        e = foreign(self.user_path, len(self._file_columns()) + 1, path, self._path, m)
        if e is not None:
            raise e
        self._examples = Examples(self.user_path, self._file_columns(), self._file_labels(),
                                  lambda p: Load.read(self, p),
                                  "label" if self.task == "classify" else self.targets[-1])
        _drop(after)                          # no MetaError from here on
        # reading the files leaves garbage all over the heap: collected now, the buffers fit and
        # evaluate allocate next find large free blocks (on a 512K heap a fit failed without it)
        gc.collect()
        for note in notes:
            self._say("note: %s" % note)
        self._say("%s: %s, %d params, %s %s, input %s; base %d rows, user %d examples; backend %s (%s)"
                  % (path, meta.get("arch", "model"), self.model.param_count(),
                     "classes" if self.task == "classify" else "regression of",
                     ", ".join(self.outputs), self._input_text(), len(self._base[1]) if self._base else 0,
                     len(self._examples.y), mf.get_backend(), mf.backend.why + self._backend_note))

    def _input_text(self):
        if len(self.input_shape) == 2:
            return "a window of %d readings x %d channels (%s)" % (self.input_shape[0], self.input_shape[1],
                                                                   ", ".join(self.features))
        return "%d features (%s)" % (self.num_features, ", ".join(self.features))

    def _named(self):
        # [(name, tensor)] for the optimizer's messages: state_dict names ('3.self_attn.in_proj_weight[0]')
        out = []
        for name, tensors in self.model.state_parts():
            if len(tensors) == 1:
                out.append((name, tensors[0]))
            else:
                for k in range(len(tensors)):
                    out.append(("%s[%d]" % (name, k), tensors[k]))
        return out

    def _file_columns(self):
        # the numeric columns of a data file before its last field
        return self.columns + self.targets[:-1]

    def _file_labels(self):
        return self.classes if self.task == "classify" else self._labels

    def _rows(self, X, y):
        """(X flat [N * num_features], y: class indices or target tuples) from the file's form."""
        if self.task == "classify":
            return X, y
        n = self.num_features
        w = n + len(self.targets) - 1
        out = array("f")
        ys = []
        for i in range(len(y)):
            out.extend(X[i * w:i * w + n])
            ys.append(tuple(X[i * w + n:(i + 1) * w]) + (float(self._labels[y[i]]),))
        return out, ys

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
        elif getattr(self, "_params_in_file", 0):
            n = self._params_in_file
            need = ("the model needs about %d bytes for its %d params (with grads, Adam state and the "
                    "step's snapshot), plus its activations" % (28 * n, n))
        else:
            need = "the heap ran out before the checkpoint's size was read (its tensor table)"
        total = self.need["total_bytes"] if self.need else 0
        frag = " (fragmented: no block large enough)" if free is not None and free > total else ""
        return MemoryError("Session: out of memory %s: %s; free heap %s bytes%s. Try a smaller "
                           "batch_size, or free memory (del big objects, gc.collect())"
                           % (what, need, "n/a" if free is None else free, frag))

    # ---- data ---------------------------------------------------------------------------

    def _standardized(self, X, y):
        # (x - mean) / std per feature; a window's number j is channel j % C
        n = self.num_features
        C = self.channels
        d = array("f", X)
        mean, std = self.mean, self.std
        for i in range(len(y)):
            for j in range(n):
                d[i * n + j] = (d[i * n + j] - mean[j % C]) / std[j % C]
        if not y:
            return None
        if self.task == "classify":
            return Dataset(Tensor((len(y), n), d), y, self.classes, self.columns)
        return _Regression(Tensor((len(y), n), d), y)

    def _raw(self, which):
        """(flat raw examples, labels or target tuples) of a named selection."""
        if which == "user":
            return self._rows(self._examples.X, self._examples.y)
        if self._base is None:
            raise ValueError("Session: no base data (%s); use data='user' or a list"
                             % ("%s missing" % self.data_path if self.data_path else
                                "the checkpoint's metadata names no 'data' file and Session(data=...) "
                                "was not given"))
        X, y = self._base
        if which == "base":
            return self._rows(X, y)
        if which == "all":
            return self._rows(X + self._examples.X, y + self._examples.y)
        train, test = self._split
        idx = train if which == "train" else test
        w = len(self._file_columns())
        out = array("f")
        for i in idx:
            out.extend(X[i * w:(i + 1) * w])
        return self._rows(out, [y[i] for i in idx])

    def _select(self, data, who):
        """A standardized data set for a selection name or a list of (features, label) pairs."""
        if isinstance(data, str):
            if data not in SELECTIONS:
                raise ValueError("%s: data must be one of %s or a list of (features, label) pairs, got %r"
                                 % (who, ", ".join(repr(s) for s in SELECTIONS), data))
            ds = self._cache.get(data)
            if ds is None:
                ds = self._standardized(*self._raw(data))
                if ds is None:
                    if data == "test" and self._base:
                        raise ValueError("%s: no test examples: n_train is %d, all %d rows of %s are "
                                         "'train'" % (who, self._m["n_train"], len(self._base[1]),
                                                      self.data_path))
                    raise ValueError("%s: no %s examples yet (add some with s.add_example(features, label))"
                                     % (who, data))
                self._cache[data] = ds
            return data, ds
        if isinstance(data, (Dataset, _Regression)):
            return "dataset", data
        X, y = self._checks().pairs(data, who)
        return "list of %d" % len(y), self._standardized(X, y)

    # ---- the rarer commands: objects of mf_commands and microformer.parts, loaded on first use

    def _checks(self):
        # what one example of this model is, and its checks (mf_commands.Inputs: example(x, who)
        # -> floats, label(y, who) -> class index or targets); made on first use
        if self._inputs is None:
            self._inputs = _commands().Inputs(self.task, self.input_shape, self.features, self.columns,
                                              self.classes, self.targets, self._labels)
        return self._inputs

    def num_examples(self):
        """The number of user examples."""
        return len(self._examples.y)

    # ---- the model's parts and freezing: microformer.parts --------------------------------

    def _model_parts(self):
        # the model's Parts (made on first use, and again after adapters came or went)
        if self._parts is None:
            from microformer.parts import model_parts
            self._parts = model_parts(self.model)
        return self._parts

    def frozen(self):
        """The names of the frozen parameters."""
        if not self._frozen:
            return []
        return [p.name for p in self._model_parts() if p.name in self._frozen]

    def trainable_summary(self):
        if self._frozen:
            from microformer.parts import trainable
            n, frozen = trainable(self._model_parts(), self._frozen)
        else:
            n, frozen = self.model.param_count(), ()
        return "trainable params %d of %d; frozen: %s" % (n, self.model.param_count(),
                                                            ", ".join(frozen) if frozen else "none")

    def fit(self, epochs=FIT_EPOCHS, data=None, lr=None, verbose=None, on_error="rollback",
            batch_size=None, micro_batch="auto", on_worse="rollback", rehearse=None, tol=None):
        """Fine-tune; one line per epoch (loss, acc, ms/step, free heap) and a progress line at
        least every 5 s. Returns a FitResult (steps, epochs, seconds, loss, ...; h[-1] is the
        last epoch's record; the last FIT_KEEP_EPOCHS epochs' records are kept).

        data: None ('user' if there are user examples, else 'train'; fit says which and why),
        a selection name or a list of (features, label) pairs.
        batch_size: rows per optimizer step (None: the session's, Session(batch_size=...)).
        micro_batch: rows per forward/backward; the gradients of a batch's micro-batches add up
        to the batch's. 'auto' (default): the largest that the memory plan (s.plan()) fits in
        the free heap, said in the fit line; an int: that many; None: the whole batch.
        on_error: 'rollback' (default): a refused step (NonFiniteError) or running out of memory
        restores the weights, optimizer state, lr and the session's flags from the start of this
        call, and gives back the memory the call took, so a failed fit changes nothing (it costs
        a copy of the trainable weights and Adam state, 12 bytes per parameter, kept with the
        optimizer); 'keep': the weights of the last good step stay.
        Every argument is checked before anything changes. Ctrl-C stops after the current step;
        the model keeps the weights of the last full step (either way).
        On the user's examples (data None or 'user'; mf_guard, microformer.guard): `rehearse`
        base training rows per example are replayed beside them (None: guard.REHEARSE), the base
        test split plus a held-out share of the examples is validated after every epoch, the best
        epoch is kept, and on_worse='rollback' (default) puts back the state from before the
        call when every epoch leaves validation worse by more than `tol` (None: guard.TOLERANCE;
        'keep': the best epoch stays). A loss that runs away stops the fit and rolls it back.
        """
        # ---- every argument first: a refused call changes nothing
        lr = _fit_args(epochs, lr, verbose, on_error)
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError("fit: batch_size must be a positive int or None (the session's %d), got %r"
                             % (self.batch_size, batch_size))
        if micro_batch not in ("auto", None) and (not isinstance(micro_batch, int) or isinstance(micro_batch, bool)
                                                   or micro_batch < 1):
            raise ValueError("fit: micro_batch must be 'auto', None or a positive int, got %r" % (micro_batch,))
        self._own_backend()
        guard = (on_worse, rehearse, tol)
        if on_worse != "rollback" or rehearse is not None or tol is not None:
            from mf_guard import check             # loaded when a guarded fit needs it
            guard = (on_worse,) + check(on_worse, rehearse, tol)
        t = self._trainer
        t.settle()              # the optimizer and rollback copy too (tensor.SETTLE_GC_BYTES)
        try:
            r = self._fit(epochs, data, lr, verbose, on_error, batch_size or self.batch_size,
                          micro_batch, guard)
        finally:
            t.unsettle()
        # the step's buffers (activations, their gradients, the kernels' scratch) go back to the
        # heap: evaluate, predict and the next fit make what they need of them again (a failed fit
        # gave them back before it raised)
        gc.collect()
        t.release()
        gc.collect()
        return r

    def _fit(self, epochs, data, lr, verbose, on_error, batch, micro, guard):
        name, ds, why = self._fit_data(data)
        mf_guard = val = None
        if name == "user" and (data is None or data == "user"):    # the guard: mf_guard.py
            import mf_guard
            guard = (guard[0],) + mf_guard.check(*guard)
            try:
                ds, val, why = mf_guard.plan(data, name, ds, why, guard[1], self._fits + 1, self.num_features,
                                             self._raw, self._base is not None, self._standardized,
                                             self._select)
            except MemoryError:
                raise self._oom("in fit, making its training set (your examples and the replayed "
                                "rows) and validation sets (rehearse=0 replays none)")
        # garbage out first: what fit keeps (optimizer, rollback copy, history) then goes into the
        # lowest free blocks, and the large ones stay whole for a new batch shape's buffers
        gc.collect()
        t = self._trainer
        before = (t.optimizer, t.has_snapshot(), self.lr, self._fits, self._dirty)
        planned = [m for m in FIT_ONLY if m not in sys.modules] if _threshold else ()
        if planned and micro == "auto":
            # the plan's code before the optimizer and rollback copy: dropped before the first
            # step, it leaves its room below them, not a hole above them
            import microformer.memplan  # noqa: F401
        self._fit_state(t, on_error)
        try:
            log = _fit_log(epochs)  # the history's records: allocated before any state changes
            batch = min(batch, len(ds))
            t.use_data(ds)
            auto = micro == "auto"       # a step out of memory halves it (Trainer.fit shrink)
            micro = t.choose_micro(batch, micro)
            _drop(planned)
        except MemoryError as e:
            self._undo(t, before)
            raise MemoryError("%s; fit changed nothing" % (self._fit_oom(t, batch, e, "before training")))
        g = None
        if mf_guard is not None:
            lr0, dirty0 = self.lr, self._dirty    # a rollback puts back weights, optimizer state, lr
            try:
                loss = mf.CrossEntropyLoss() if self.task == "classify" else _MSE(len(self.targets))
                g = mf_guard.make(t, loss, val, guard[0], guard[2], self.batch_size, None if on_error != "rollback" else
                                  (lambda: (t.restore(), setattr(self, "lr", lr0), setattr(self, "_dirty", dirty0))))
                g.start(ds)
            except MemoryError:
                self._undo(t, before)
                raise self._oom("in fit, making the guard (its copy of the trainable parameters, "
                                "4 bytes each, and the validation's buffers)")
            why += "; " + mf_guard.policy(g)
        # ---- from here on, state changes
        opt = t.optimizer
        if lr is not None:
            self.lr = lr
            opt.lr = lr
        verbose = self.verbose if verbose is None else verbose
        if verbose:
            print("fit on %s: %s, %s, batch %d%s, lr %g; %s"
                  % (why, _n(len(ds), "example"), _n(epochs, "epoch"), batch,
                     "" if not micro or micro >= batch else
                     " in micro-batches of %d (the memory plan of a whole batch does not fit the free heap)" % micro,
                     self.lr, self.trainable_summary()))
        steps0 = opt.steps
        self._fits += 1
        if not self._adapter_ids:
            self._dirty = True
        try:
            t.fit(ds, epochs=epochs, batch_size=batch, micro_batch=micro, seed=self._fits,
                  verbose=verbose, log=log, on_epoch=None if g is None else g.on_epoch,
                  shrink=auto)
        except KeyboardInterrupt:
            # between steps (the trainer catches it inside one); no update is ever half done
            log.interrupted = True
        except (mf_guard.Diverged if mf_guard is not None else ()):
            pass                    # the guard stopped a loss that ran away: g.finish() rolls back
        except Exception as e:
            self.model.train()
            if isinstance(e, MemoryError):
                e = MemoryError(self._fit_oom(t, batch, e, "training (%d of %d epochs and %d steps done)"
                                              % (log.epochs, epochs, opt.steps - steps0)))
            if on_error == "rollback":
                undone = opt.steps - steps0
                t.restore()
                self._undo(t, before)
                raise type(e)("%s; fit rolled back: the weights, optimizer state, lr and the session's "
                              "state are those from before this call (%s undone)" % (e, _n(undone, "step")))
            rec = _fit_record(self, name, len(ds), log, opt.steps - steps0)
            rec["error"] = type(e).__name__
            _add_fit(self.meta, rec)
            raise type(e)("%s; fit(on_error='keep'): the model keeps the weights of the last good "
                          "step (%s of this call, recorded in the fit history)"
                          % (e, _n(rec["steps"], "step")))
        finally:
            self.model.train()
        # the optimizer's count: a Ctrl-C that lands after an epoch's last step but before the
        # trainer records that epoch leaves the history one epoch short, never the steps
        steps = opt.steps - steps0
        if g is not None:           # what the guard keeps (a rollback puts back the lr from before this call)
            what = mf_guard.finish(g, log.interrupted, verbose, on_error, self.lr)
        rec = _fit_record(self, name, len(ds), log, steps)
        if g is not None:
            rec["guard"] = what
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
                              % (FIT_KEEP_EPOCHS, _mem_free(), _n(steps, "step")))
        line = "<fit on %s: %s, %s%s, %s/step%s>" % (
            name, _n(steps, "step"), _n(rec["epochs"], "epoch"), "" if rec["loss"] is None else ", loss %.4f" % rec["loss"],
            duration(1000 * seconds / max(1, steps)), ", interrupted" if interrupted else "")
        return FitResult(line, rec, hist)

    def _undo(self, t, before):
        # the session as before a failed fit: its flags, and no optimizer or rollback copy that
        # this call made (their memory goes back); the weights were restored by the caller
        opt, had_snap, self.lr, self._fits, self._dirty = before
        if t.optimizer is not opt:
            t.optimizer = None
        if not had_snap:
            t.drop_snapshot()
        t.unset_checkpoint()        # the blocks as they were, when the plan switched checkpoint on
        t.release()
        gc.collect()

    def _fit_oom(self, t, batch, e, when):
        # out of memory in fit: the plan's figures, the free heap once this call's memory is
        # back, and a batch that fits it
        t.release()
        free = _mem_free()
        try:                  # the plan's probes allocate: this message must not stop the rollback
            from microformer.memplan import plan_text
            m = t.tried_micro(batch, free) if free is not None else None
            plan = plan_text(t.plan(batch, m or 1))
        except MemoryError:
            t.release()
            m = None
            plan = "no room left to make the memory plan"
        return ("Session: out of memory in fit, %s (%s): %s; free heap %s bytes after giving back "
                "this fit's buffers. %s" % (when, e, plan, "n/a" if free is None else free,
                                            "s.fit(micro_batch=%d) fits that plan" % m if m else
                                            "Freeze more (s.freeze), use LoRA (s.lora()), or free memory"))

    def _fit_data(self, data):
        # fit's examples: (selection name, pairs, why fit trains on them)
        why = None
        if data is None:
            n_user = len(self._examples.y)
            data = "user" if n_user else "train"
            why = ("your %d example%s in %s (data=None picks them when there are any; data='train' "
                   "for the pretraining split)" % (n_user, "" if n_user == 1 else "s", self.user_path)
                   if n_user else "the checkpoint's training split (data=None: no user examples yet)")
        try:
            name, ds = self._select(data, "fit")
        except MemoryError:
            raise self._oom("in fit, reading the examples")
        return name, ds, "%s, as asked" % name if why is None else why

    def _fit_state(self, t, on_error):
        # the optimizer (made on the first fit) and, for on_error='rollback', the rollback copy
        # taken now. Nothing the model holds changes here.
        try:                        # its state and the step's shadow: a few blocks of 4 bytes per param
            if t.optimizer is None:
                t.lr = self.lr
            t.make_optimizer()
            # its kernel now (imported on first use), not in the first step: compiling a .py
            # source there would leave its garbage among the step's new buffers
            mf.backend.K.adam_step
        except ValueError:
            raise ValueError("fit: every layer is frozen; unfreeze something first (s.unfreeze())")
        except MemoryError:
            t.optimizer = None
            raise self._oom("creating the optimizer")
        if on_error != "rollback":
            return
        try:
            t.snapshot()
        except MemoryError:
            t.drop_snapshot()
            raise self._oom("making fit's rollback copy (%d bytes; fit(on_error='keep') "
                            "trains without it)" % (12 * t.optimizer.numel))

    @property
    def _opt(self):
        # the optimizer (None before the first fit): the trainer's
        return self._trainer.optimizer

    @_opt.setter
    def _opt(self, opt):
        # None: the parameters that train changed; the next fit makes a new optimizer
        self._trainer.optimizer = opt
        self._trainer.drop_snapshot()

    def evaluate(self, data="test", verbose=None):
        """Accuracy and per-class counts on a selection (default 'test') or a list of pairs;
        for a regression model RMSE and MAE per target."""
        self._own_backend()
        try:
            name, ds = self._select(data, "evaluate")
        except MemoryError:
            raise self._oom("in evaluate, reading the examples")
        if self.task == "regress":
            return self._evaluate_regress(name, ds, verbose)
        try:
            # in batches of the last fit's micro-batch, if smaller: its buffers serve them
            t = self._trainer
            acc, confusion = t.evaluate(ds, min(self.batch_size, t.last_rows or self.batch_size))
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

    def _evaluate_regress(self, name, ds, verbose):
        try:
            return _commands().evaluate_regress(self._trainer, ds, self.batch_size, self.targets, name,
                                                self.verbose if verbose is None else verbose)
        except MemoryError:
            raise self._oom("in evaluate")
        finally:
            self.model.train()

    def predict(self, features, verbose=None):
        """(label, [probability per class]) for one example in raw units; for a regression model
        a result whose .values are the predicted targets."""
        return _commands().predict(self._checks(), self._trainer, self.mean, self.std, features,
                                   self.verbose if verbose is None else verbose)

    def _make_net(self, exclude=None):
        # the trainer of fit, over the model as it is now (exclude: ids of frozen tensors inside
        # partly frozen layers, which the optimizer leaves out); a new one has no optimizer yet
        t = Trainer(self.model, self._loss, None, self.batch_size, None, self._shape, self.lr,
                    exclude or {}, self._named())
        t.rollback = True                     # fit(on_error='rollback'), the default, takes its copy
        self._trainer = t

    # ---- the commands a session that loads, fits and evaluates never runs: mf_methods.py,
    # loaded on first use (add_example, clear_examples, drifted_examples, parts, freeze,
    # unfreeze, plan, save, lora, save_adapter, load_adapter, merge, int8, info); its functions
    # replace these stubs on the class then
    add_example = stub(_methods, "add_example")
    add_examples = stub(_methods, "add_examples")
    clear_examples = stub(_methods, "clear_examples")
    drifted_examples = stub(_methods, "drifted_examples")
    parts = stub(_methods, "parts")
    freeze = stub(_methods, "freeze")
    unfreeze = stub(_methods, "unfreeze")
    plan = stub(_methods, "plan")
    save = stub(_methods, "save")
    lora = stub(_methods, "lora")
    save_adapter = stub(_methods, "save_adapter")
    load_adapter = stub(_methods, "load_adapter")
    merge = stub(_methods, "merge")
    int8 = stub(_methods, "int8")
    info = stub(_methods, "info")

    def __repr__(self):
        return "<finetune.Session %s: %d user examples>" % (self.checkpoint_path, len(self._examples.y))


# ---- fit's history -----------------------------------------------------------
# A fit keeps the per-epoch records of its last FIT_KEEP_EPOCHS epochs (the FitResult) and
# running totals over all of them; the checkpoint keeps the records of the last FIT_KEEP_FITS
# fits in meta['history'] and totals over every fit in meta['fit_totals']. Both are bounded, so
# a fit of any length holds, and saves, the same few KB.
FIT_KEEP_EPOCHS = 50
FIT_KEEP_FITS = 20
FIT_ON_ERROR = ("rollback", "keep")


def _fit_log(epochs):
    # room for the records of the last FIT_KEEP_EPOCHS epochs, or of every epoch of a shorter fit
    from microformer.train import FitLog
    return FitLog(min(epochs, FIT_KEEP_EPOCHS))


def _fit_record(s, name, n, log, steps):
    """The session's record of one fit (what meta['history'] keeps)."""
    loss = None
    if log.epochs:
        loss = log.record(log.epochs - 1)["loss"]
    return {"data": name, "n": n, "epochs": log.epochs, "steps": steps, "lr": s.lr,
            "seconds": log.ms / 1000, "interrupted": log.interrupted, "loss": loss,
            "frozen": s.frozen()}


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
