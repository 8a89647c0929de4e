# mf_methods.py: the Session methods a session that loads, fits and evaluates never runs, imported
# on first use so that their code stays off its heap (a board without PSRAM has a small one): the
# user examples' commands (add_example, clear_examples, drifted_examples), the parts and freezing,
# plan, save, LoRA and int8 (lora, save_adapter, load_adapter, merge, int8) and info. Each
# method of Methods is a Session method: mf_session binds every name in METHODS to Session on
# first use (Session.lora and the rest are these functions then); Methods is never made.
from mf_examples import _mem_free, _n

METHODS = ("add_example", "add_examples", "clear_examples", "drifted_examples", "parts", "freeze", "unfreeze",
           "_set_trainable", "_apply_frozen", "plan", "save", "_adapted", "_adapter_path", "lora",
           "save_adapter", "load_adapter", "merge", "int8", "info")


def _commands():
    # mf_commands, imported on first use (as mf_session's)
    import mf_commands
    return mf_commands


class Methods:
    """Session's rarer methods (bound to Session by mf_session on first use)."""

    def add_example(self, features, label):
        """Append one labelled example (raw units) to the user data file and to this session."""
        return self.add_examples([(features, label)], "add_example")

    def add_examples(self, pairs, who="add_examples"):
        """Append (features, label) pairs (raw units); checked first, then written in one go."""
        self._examples.append(self._checks().rows(pairs, who))
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        n = len(self._examples.y)
        self._say("%s in %s" % (_n(n, "user example"), self.user_path))
        return n

    def clear_examples(self):
        """Forget the user examples; the user data file is kept as a backup (user.csv.bak, then
        .bak2, ...), never deleted. Returns the backup's path (None if there was no file)."""
        n = len(self._examples.y)
        kept = self._examples.clear()
        self._cache.pop("user", None)
        self._cache.pop("all", None)
        if kept:
            self._say("user examples cleared: %s moved to %s (to restore: os.rename(%r, %r))"
                      % (_n(n, "example"), kept, kept, self.user_path))
        else:
            self._say("no user examples to clear (%s does not exist)" % self.user_path)
        return kept

    def drifted_examples(self, n=None, part="train", scale=None, offset=None, seed=0):
        """(features, label) pairs as the demo's drifted sensor reads base rows (raw units);
        see mf_drift.drifted_examples."""
        from mf_drift import drifted_examples
        return _commands().Pairs(drifted_examples(self.task, self.input_shape, self.classes, self._raw,
                                                  n, part, scale, offset, seed))

    def parts(self, verbose=None):
        """The model's parameters as freeze/unfreeze name them: [(name, shape, kinds, frozen)];
        prints one line each."""
        return _commands().parts_table(self._model_parts(), self._frozen,
                                       self.verbose if verbose is None else verbose)

    def freeze(self, *parts):
        """Keep these parts' weights fixed in fit(): kinds ('embedding' 'attention' 'norm' 'ffn'
        'head' 'input' 'bias' 'all'), state_dict names or prefixes ('3.self_attn', '5.weight'),
        globs ('3.*', '*.bias') or layer indices. Prints what changed; returns the names."""
        return self._set_trainable(parts, False, "freeze")

    def unfreeze(self, *parts):
        """Train these parts again (no argument: everything). Prints what changed."""
        return self._set_trainable(parts, True, "unfreeze")

    def _set_trainable(self, parts, flag, who):
        from microformer.parts import freeze
        self._frozen, changed = freeze(self._model_parts(), self.model, parts, self._frozen, flag, who)
        self._apply_frozen()
        if self.verbose:
            print(_commands().changed_text(who, changed, flag))
            print(self.trainable_summary())
        return [p.name for p in changed]

    def _apply_frozen(self):
        # the layers' flags as the frozen set says; the optimizer's parameters change: a new trainer
        from microformer.parts import apply
        self._make_net(apply(self._model_parts(), self._frozen, self._adapter_ids))

    def plan(self, batch_size=None, micro_batch=None, data=None, verbose=None):
        """The memory plan of a fit step (microformer.train.Trainer.plan): weights, grads,
        optimizer state, rollback copy, activations, the batch, and the peak in bytes, with the
        free heap beside it. batch_size: None: the session's; micro_batch: None: the whole batch;
        data: what fit would train on (None: as fit picks it)."""
        from microformer.memplan import plan_text
        t = self._trainer
        t.use_data(self._fit_data(data)[1])
        info = t.plan(batch_size or self.batch_size, micro_batch)
        t.use_data(None)
        info["free"] = _mem_free()
        if self.verbose if verbose is None else verbose:
            print("%s; free heap %s bytes" % (plan_text(info), info["free"]))
        return info

    def save(self, path=None):
        """Write the checkpoint atomically (default: the one this session loaded)."""
        if path is not None and not (isinstance(path, str) and path):
            raise ValueError("save: path must be a file name (a non-empty str) or None, got %r" % (path,))
        path = self._path(path) if path else self.checkpoint_path
        from microformer import checkpoint
        self.meta["user_examples"] = len(self._examples.y)
        n = checkpoint.save(path, self.model, self.meta)
        if path == self.checkpoint_path:
            self._dirty = False
        self._say("saved %s (%d bytes)" % (path, n))
        return n

    def _adapted(self, before, what):
        # after adapters came or went: the parts, the frozen set (every base tensor when `before`
        # is None, else the names frozen before), a new trainer and the memory a fit needs
        from mf_adapter import adapted, memory_text
        self._parts = None
        self._adapter_ids, self._frozen, spec = adapted(self.model, self._model_parts(), before,
                                                        "spec" in self.meta)
        if spec is not None:
            self.meta["spec"] = spec
        self._apply_frozen()
        full = self.need
        self.need = self.model.summary((self.batch_size,) + self._shape, show=False)
        if self.verbose:
            print(what)
            print(self.trainable_summary())
            print(memory_text(self.batch_size, self.need, full))

    def _adapter_path(self, path, who):
        from mf_adapter import adapter_path
        return adapter_path(self._path(path) if isinstance(path, str) and path else path,
                            self.checkpoint_path, who)

    def lora(self, rank=4, alpha=8, targets=None):
        """Add LoRA adapters (rank, alpha: scaling alpha/rank) to the linear maps `targets` names
        (kinds 'attention' 'ffn' 'dense', or names / globs; None: 'attention' and 'ffn', those
        the model has), freeze everything else, and print the adapted maps, the trainable
        parameters and the memory the fine-tune needs. s.unfreeze('head') trains the head too.
        Returns the adapted maps' names."""
        from mf_adapter import lora
        names, what = lora(self.model, rank, alpha, targets, self._dirty)
        self._adapted(None, what)
        return names

    def save_adapter(self, path=None):
        """Write only the trained tensors (adapters, or what is unfrozen) atomically, naming this
        session's checkpoint as their base; default path: model.adapter.mfck beside it."""
        from mf_adapter import save_adapter
        path = self._adapter_path(path, "save_adapter")
        n = save_adapter(path, self.model, self.checkpoint_path, len(self._examples.y), self._dirty)
        self._say("saved adapter %s (%d bytes) for %s" % (path, n, self.checkpoint_path))
        return n

    def load_adapter(self, path):
        """Load an adapter file on top of this session's checkpoint, which must be the base it
        was saved for (else CheckpointError naming both CRCs); refused after a fit that was not
        saved. Both files are checked whole before anything changes."""
        from mf_adapter import load_adapter
        path = self._adapter_path(path, "load_adapter")
        what = load_adapter(path, self.model, self.checkpoint_path, self._dirty)
        self._dirty = False
        self._opt = None
        self._adapted(None, what)

    def merge(self):
        """Fold the adapters into the weights (W += (alpha/r) B A) and remove them: a plain model
        (s.save() then writes it whole). Frozen parts stay frozen. Returns how many."""
        from mf_adapter import merge
        before = dict(self._frozen)
        n, what = merge(self.model, bool(self._adapter_ids))
        self._opt = None
        self._dirty = True
        self._adapted(before, what)
        return n

    def int8(self, parts=None):
        """Store the frozen weight matrices (Dense, attention, FFN; or those `parts` names, which
        must be frozen) as int8 with a scale per row (microformer.quant); prints the weight memory
        before and after. s.save() writes them so. Returns the names converted."""
        from mf_adapter import int8
        names, what, short = int8(self.model, parts, self.verbose)
        self._adapted(dict(self._frozen), what)
        if not self.verbose:
            print(short)
        return names

    def info(self):
        """Print what this session holds."""
        print(_commands().info_text(self.checkpoint_path, self.meta, self.model.param_count(), self.task,
                                    self.outputs, self._input_text(), self.data_path,
                                    len(self._base[1]) if self._base else 0, self.user_path,
                                    len(self._examples.y), self.trainable_summary(), self.batch_size,
                                    self.need["total_bytes"], _mem_free()))
