# mf_adapter.py: finetune.Session's LoRA commands (s.lora, s.save_adapter, s.load_adapter,
# s.merge) and s.int8, imported on first use: a session that never adapts keeps this code (and
# microformer.lora) off a small board's heap.
import gc

from microformer import checkpoint

from mf_examples import _is_number, _mem_free, _n


def adapted(self, before, what):
    # after adapters came or went: parts, frozen set (every base tensor frozen when `before`
    # is None, else the names frozen before), the optimizer, and the memory a fit needs
    from microformer.lora import adapters
    self._adapter_ids = {}
    for _, a in adapters(self.model):
        self._adapter_ids[id(a.A)] = 1
        self._adapter_ids[id(a.B)] = 1
    self._find_parts()
    if "spec" in self.meta:                 # save() writes the model as it is now
        from microformer.spec import to_spec
        self.meta["spec"] = to_spec(self.model)
    if before is None:
        self._frozen = {}
        for p in self._parts:
            if id(p.tensors[0]) not in self._adapter_ids:
                self._frozen[p.name] = 1
    else:
        self._frozen = {}
        for p in self._parts:
            if p.name in before:
                self._frozen[p.name] = 1
    self._make_net()
    self._apply_frozen()
    self._snap = None
    full = self.need
    self.need = self.model.summary((self.batch_size,) + self._shape, show=False)
    if self.verbose:
        print(what)
        print(self.trainable_summary())
        n = self.need
        print("memory for a fine-tune batch of %d: %d bytes (weights and trainable state %d, "
              "activations %d); before: %d bytes; free heap %s"
              % (self.batch_size, n["total_bytes"], n["param_bytes"], n["activation_bytes"],
                 full["total_bytes"] if full else 0, _mem_free()))


def lora(self, rank=4, alpha=8, targets=None):
    """Add LoRA adapters (rank, alpha: scaling alpha/rank) to the linear maps `targets` names
    (kinds 'attention' 'ffn' 'dense', or names / globs as s.parts() shows them without the
    '.weight'; None: 'attention' and 'ffn', those of the two the model has), freeze everything
    else, and print the adapted maps, the trainable parameters and the memory the fine-tune
    needs. s.unfreeze('head') trains the head too. Returns the adapted maps' names."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError("lora: rank must be an int >= 1, got %r" % (rank,))
    if not _is_number(alpha) or not alpha > 0:
        raise ValueError("lora: alpha must be a positive number, got %r" % (alpha,))
    if self._dirty:
        raise ValueError("lora: the base weights were fitted in this session and not saved; "
                         "s.save() first (an adapter names the checkpoint it applies to)")
    from microformer.lora import add_lora, linears
    if targets is None:
        kinds = [k for _, k, _, _ in linears(self.model)]
        targets = [k for k in ("attention", "ffn") if k in kinds]
        if not targets:
            raise ValueError("lora: the model has no attention or feed-forward linear map; name "
                             "targets (e.g. targets='dense')")
    gc.collect()
    found = add_lora(self.model, rank, alpha, targets)
    names = [n for n, _ in found]
    adapted(self, None, "lora: rank %d, alpha %s on %s: %s"
                  % (rank, alpha, _n(len(names), "linear map"), ", ".join(names)))
    return names


def adapter_path(self, path, who):
    if path is not None and not (isinstance(path, str) and path):
        raise ValueError("%s: path must be a file name (a non-empty str) or None, got %r" % (who, path))
    if path:
        return self._path(path)
    base = self.checkpoint_path
    return (base[:-5] if base.endswith(".mfck") else base) + ".adapter.mfck"


def save_adapter(self, path=None):
    """Write only the trained tensors (the adapters, or what is unfrozen) atomically, naming
    this session's checkpoint as their base; default path: model.adapter.mfck beside it."""
    path = adapter_path(self, path, "save_adapter")
    if self._dirty:
        raise ValueError("save_adapter: the base weights were fitted in this session and not "
                         "saved: the adapter would not reproduce the model (s.save() instead)")
    n = checkpoint.save_adapter(path, self.model, self.checkpoint_path,
                                {"user_examples": len(self._examples.y)})
    self._say("saved adapter %s (%d bytes) for %s" % (path, n, self.checkpoint_path))
    return n


def load_adapter(self, path):
    """Load an adapter file (s.save_adapter) on top of this session's checkpoint, which must be
    its base (else CheckpointError naming both CRCs); its base weights are read again, so it is
    refused after a fit that was not saved. Both files are checked whole before anything changes."""
    path = adapter_path(self, path, "load_adapter")
    if not isinstance(path, str):
        raise ValueError("load_adapter: path must be a file name, got %r" % (path,))
    if self._dirty:
        raise ValueError("load_adapter: the base weights were fitted in this session and not saved: "
                         "loading %s would replace them with %s's; s.save() first (or start a new "
                         "Session to drop the fit)" % (path, self.checkpoint_path))
    checkpoint.load_adapter(path, self.model, self.checkpoint_path)
    self._dirty = False
    self._opt = None
    adapted(self, None, "loaded adapter %s on %s" % (path, self.checkpoint_path))


def merge(self):
    """Fold the adapters into the weights (W += (alpha/r) B A) and remove them: a plain model
    (s.save() then writes it whole). Frozen parts stay frozen. Returns how many."""
    if not self._adapter_ids:
        raise ValueError("merge: the model has no adapters (s.lora() or s.load_adapter() adds them)")
    from microformer.lora import merge_lora
    before = dict(self._frozen)
    n = merge_lora(self.model)
    self._opt = None
    self._dirty = True
    adapted(self, before, "merged %s into the weights" % _n(n, "adapter"))
    return n


def int8(self, parts=None):
    """Store the frozen weight matrices (or those `parts` names) as int8 with a scale per row;
    print the weight memory before and after. Returns the names converted."""
    from microformer import quant
    before = quant.weight_bytes(self.model)
    gc.collect()
    rep = quant.int8(self.model, parts, show=self.verbose)
    after = quant.weight_bytes(self.model)
    adapted(self, dict(self._frozen), "int8: %d weight matrices; weight memory %d -> %d bytes"
            % (len(rep), before, after))
    if not self.verbose:
        print("int8: weight memory %d -> %d bytes" % (before, after))
    return [r[0] for r in rep]
