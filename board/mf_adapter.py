# mf_adapter.py: what finetune.Session's LoRA commands (s.lora, s.save_adapter, s.load_adapter,
# s.merge) and s.int8 do to the model, imported on first use: a session that never adapts keeps
# this code (and microformer.lora) off a small board's heap. The functions take the model and
# the session's facts and return what the session keeps (its Session._adapted does that).
import gc

from microformer import checkpoint

from mf_examples import _is_number, _mem_free, _n


def adapted(model, parts, before, has_spec):
    """After adapters came or went: ({id: 1} of the LoRA tensors, the frozen names: every base
    tensor when `before` is None, else those of `before` the model still has, and the model's
    spec when the checkpoint's metadata has one (None otherwise))."""
    from microformer.lora import adapters
    ids = {}
    for _, a in adapters(model):
        ids[id(a.A)] = 1
        ids[id(a.B)] = 1
    frozen = {}
    for p in parts:
        if (id(p.tensors[0]) not in ids) if before is None else (p.name in before):
            frozen[p.name] = 1
    spec = None
    if has_spec:                            # save() writes the model as it is now
        from microformer.spec import to_spec
        spec = to_spec(model)
    return ids, frozen, spec


def memory_text(batch, need, full):
    """The fine-tune's memory after adapting, beside what it was."""
    return ("memory for a fine-tune batch of %d: %d bytes (weights and trainable state %d, "
            "activations %d); before: %d bytes; free heap %s"
            % (batch, need["total_bytes"], need["param_bytes"], need["activation_bytes"],
               full["total_bytes"] if full else 0, _mem_free()))


def _unsaved(who, dirty):
    if dirty:
        raise ValueError("%s: the base weights were fitted in this session and not saved; "
                         "s.save() first (an adapter names the checkpoint it applies to)" % who)


def lora(model, rank, alpha, targets, dirty):
    """Add LoRA adapters (rank, alpha: scaling alpha/rank) to the linear maps `targets` names
    (kinds 'attention' 'ffn' 'dense', or names / globs as s.parts() shows them without the
    '.weight'; None: 'attention' and 'ffn', those of the two the model has). Refused when the
    base weights were fitted and not saved (`dirty`). Returns (names, the line to print)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError("lora: rank must be an int >= 1, got %r" % (rank,))
    if not _is_number(alpha) or not alpha > 0:
        raise ValueError("lora: alpha must be a positive number, got %r" % (alpha,))
    _unsaved("lora", dirty)
    from microformer.lora import add_lora, linears
    if targets is None:
        kinds = [k for _, k, _, _ in linears(model)]
        targets = [k for k in ("attention", "ffn") if k in kinds]
        if not targets:
            raise ValueError("lora: the model has no attention or feed-forward linear map; name "
                             "targets (e.g. targets='dense')")
    gc.collect()
    found = add_lora(model, rank, alpha, targets)
    names = [n for n, _ in found]
    return names, ("lora: rank %d, alpha %s on %s: %s"
                   % (rank, alpha, _n(len(names), "linear map"), ", ".join(names)))


def adapter_path(path, base, who):
    """The adapter file's path: `path` (already under the session's root), or None: the
    checkpoint `base`'s name with .adapter.mfck."""
    if path is not None and not (isinstance(path, str) and path):
        raise ValueError("%s: path must be a file name (a non-empty str) or None, got %r" % (who, path))
    if path:
        return path
    return (base[:-5] if base.endswith(".mfck") else base) + ".adapter.mfck"


def save_adapter(path, model, base, n_examples, dirty):
    """Write only the trained tensors (the adapters, or what is unfrozen) atomically, naming the
    checkpoint `base` as theirs. Returns the bytes written."""
    if dirty:
        raise ValueError("save_adapter: the base weights were fitted in this session and not "
                         "saved: the adapter would not reproduce the model (s.save() instead)")
    return checkpoint.save_adapter(path, model, base, {"user_examples": n_examples})


def load_adapter(path, model, base, dirty):
    """Load an adapter file (s.save_adapter) on top of the checkpoint `base`, which must be its
    base (else CheckpointError naming both CRCs); refused after a fit that was not saved. Both
    files are checked whole before anything changes. Returns the line to print."""
    if dirty:
        raise ValueError("load_adapter: the base weights were fitted in this session and not saved: "
                         "loading %s would replace them with %s's; s.save() first (or start a new "
                         "Session to drop the fit)" % (path, base))
    checkpoint.load_adapter(path, model, base)
    return "loaded adapter %s on %s" % (path, base)


def merge(model, has_adapters):
    """Fold the adapters into the weights (W += (alpha/r) B A) and remove them. Returns (how
    many, the line to print)."""
    if not has_adapters:
        raise ValueError("merge: the model has no adapters (s.lora() or s.load_adapter() adds them)")
    from microformer.lora import merge_lora
    n = merge_lora(model)
    return n, "merged %s into the weights" % _n(n, "adapter")


def int8(model, parts, verbose):
    """Store the frozen weight matrices (or those `parts` names) as int8 with a scale per row.
    Returns (the names converted, the line to print, the short line for a quiet session)."""
    from microformer import quant
    before = quant.weight_bytes(model)
    gc.collect()
    rep = quant.int8(model, parts, show=verbose)
    after = quant.weight_bytes(model)
    return ([r[0] for r in rep], "int8: %d weight matrices; weight memory %d -> %d bytes" % (len(rep), before, after),
            "int8: weight memory %d -> %d bytes" % (before, after))
