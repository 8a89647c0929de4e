# microformer.parts: a model's parameters by name and kind, and freezing them.
# The names are those of model.state_parts() ('3.self_attn.in_proj_weight', '5.bias'); a part is
# chosen by kind, name, prefix, glob or top-level layer index. One implementation, used by the
# board's session (s.parts(), s.freeze(), s.unfreeze()) and by code that trains a model itself:
#   parts = model_parts(model)
#   frozen = freeze(parts, model, ['input', '*.bias'])         # names; checked before anything changes
#   exclude = apply(parts, frozen)                              # the layers' trainable flags
#   Trainer(model, loss, exclude=exclude, ...)                  # the optimizer leaves those out
from .layer import changed, release_grad

# kinds of parameters a selection takes besides names, globs and layer indices
KINDS = ("embedding", "attention", "norm", "ffn", "head", "input", "bias", "all")
ALIASES = {"embed": "input"}       # the name 'input' had before kinds came from the model
PARTS = KINDS + tuple(ALIASES)     # every kind a selection may name


class Part:
    """One named parameter of the model, as model.state_parts() names it: its tensors (an
    in_proj_weight holds Wq, Wk, Wv), the leaf layer that owns them, its kinds and the index of
    its top-level layer."""

    def __init__(self, name, tensors, layer, top):
        self.name = name
        self.tensors = tensors
        self.layer = layer
        self.top = top
        self.kinds = []
        self.size = 0
        for t in tensors:
            self.size += t.size

    def shape(self):
        s = list(self.tensors[0].shape)
        for t in self.tensors[1:]:
            s[0] += t.shape[0]
        return s

    def __repr__(self):
        return "<Part %s %s %s>" % (self.name, "x".join(str(d) for d in self.shape()), " ".join(self.kinds))


def _walk(layer, above, out):
    # (leaf layer, type names of the layers above it) for every layer holding parameters itself
    subs = layer.sublayers() if hasattr(layer, "sublayers") else ()
    if subs:
        here = above + [type(layer).__name__]
        for sub in subs:
            _walk(sub, here, out)
    elif hasattr(layer, "params") and layer.params():
        out.append((layer, above))
    return out


def model_parts(model):
    """[Part] of a Sequential, in state_dict order, each with its kinds:
    embedding  Embedding / positional embedding tables
    attention  attention projections (an Attention layer, a block's self_attn / cross-attention)
    norm       LayerNorm scale and shift
    ffn        the feed-forward layers of a block (linear1, linear2) or a FeedForward
    head       the last Dense of the Sequential (the output layer)
    input      everything before the first layer holding attention (the input stem)
    bias       every bias, and the LayerNorms (bias-only fine-tuning)
    """
    L = model.layers
    owner = {}
    leaves = []
    for i in range(len(L)):
        for leaf, above in _walk(L[i], [], []):
            leaves.append((i, leaf, above))
            for p, _ in leaf.params():
                owner[id(p)] = (i, leaf, above)
    parts = []
    seen = {}
    for name, tensors in model.state_parts():
        k = owner.get(id(tensors[0]))
        if k is None:
            continue
        parts.append(Part(name, tensors, k[1], k[0]))
        for t in tensors:
            seen[id(t)] = 1
    for i, leaf, above in leaves:          # a layer of one's own without state_parts: its own names
        for p, _ in leaf.params():
            if id(p) not in seen:
                parts.append(Part("%d.%s" % (i, p.name or "param"), [p], leaf, i))
    first_att = len(L)
    for i, leaf, above in leaves:
        if type(leaf).__name__ == "Attention":
            first_att = i
            break
    head = -1
    for i in range(len(L)):
        if type(L[i]).__name__ == "Dense":
            head = i
    for p in parts:
        kind = type(p.layer).__name__
        above = owner[id(p.tensors[0])][2]
        k = p.kinds
        if kind in ("Embedding", "LearnedPositionalEmbedding", "PositionalEncoding"):
            k.append("embedding")
        if kind == "Attention":
            k.append("attention")
        if "Norm" in kind:
            k.append("norm")
        if "FeedForward" in above or kind == "FeedForward":
            k.append("ffn")
        if p.top == head and p.layer is L[head]:
            k.append("head")
        if p.top < first_att and "head" not in k:
            k.append("input")
        if "Norm" in kind or p.name.endswith("bias"):
            k.append("bias")
    return parts


def glob(pat, s):
    """fnmatch for '*' (any run, dots included) and '?' (one character)."""
    if not pat:
        return not s
    c = pat[0]
    if c == "*":
        for i in range(len(s) + 1):
            if glob(pat[1:], s[i:]):
                return True
        return False
    return bool(s) and (c == "?" or c == s[0]) and glob(pat[1:], s[1:])


def valid(parts, model):
    """The words of an error saying what a selection may name in this model."""
    have = []
    for k in KINDS:
        if k == "all" or any(k in p.kinds for p in parts):
            have.append(k)
    return ("kinds %s; a layer index 0..%d; a name, a prefix or a glob of %s"
            % (", ".join(repr(k) for k in have), len(model.layers) - 1, ", ".join(p.name for p in parts)))


def select(parts, model, part, who):
    """[Part] that one selection names: a kind (KINDS, ALIASES), a name or a dotted prefix of
    names ('3.self_attn'), a glob ('*.bias'), or a top-level layer index (negative from the end).
    ValueError naming `who` and listing what is valid when it names none."""
    L = model.layers
    if isinstance(part, int) and not isinstance(part, bool):
        if not -len(L) <= part < len(L):
            raise ValueError("%s: layer index %d out of range (the model has layers 0..%d)"
                             % (who, part, len(L) - 1))
        i = part % len(L)
        got = [p for p in parts if p.top == i]
        if not got:
            raise ValueError("%s: layer %d (%s) has no parameters; layers with parameters: %s"
                             % (who, i, type(L[i]).__name__,
                                ", ".join(sorted(set("%d %s" % (p.top, type(L[p.top]).__name__) for p in parts)))))
        return got
    if not isinstance(part, str) or not part:
        raise ValueError("%s: a part must be a str or a layer index, got %r; valid: %s"
                         % (who, part, valid(parts, model)))
    kind = ALIASES.get(part, part)
    if kind == "all":
        return list(parts)
    if kind in KINDS:
        got = [p for p in parts if kind in p.kinds]
        if not got:
            raise ValueError("%s: this model has no %r parameters; valid: %s" % (who, part, valid(parts, model)))
        return got
    if "*" in part or "?" in part:
        got = [p for p in parts if glob(part, p.name)]
    else:
        got = [p for p in parts if p.name == part or p.name.startswith(part + ".")]
    if not got:
        raise ValueError("%s: unknown part %r; valid: %s" % (who, part, valid(parts, model)))
    return got


def choose(parts, model, selections, who):
    """[Part] named by any of `selections` (none: 'all'), each once, in the order first named;
    every selection is checked before the caller changes anything."""
    chosen = []
    for part in selections or ("all",):
        for p in select(parts, model, part, who):
            if p not in chosen:
                chosen.append(p)
    return chosen


def freeze(parts, model, selections, frozen=None, flag=False, who="freeze"):
    """The frozen names after freezing (flag False) or unfreezing (flag True) what `selections`
    name, as a new dict {name: 1} (`frozen`: the names frozen before, unchanged), and the parts
    whose state changed: (frozen, changed). Nothing is applied to the model: apply() does that."""
    chosen = choose(parts, model, selections, who)
    out = dict(frozen or {})
    changed_parts = [p for p in chosen if (p.name in out) == flag]
    for p in changed_parts:
        if flag:
            del out[p.name]
        else:
            out[p.name] = 1
    return out, changed_parts


def apply(parts, frozen, adapted=None):
    """Make the model train all but the parts named in `frozen` ({name: 1}): a layer all of whose
    parameters are frozen is frozen itself (trainable False: no weight gradients at all); in a
    partly frozen layer the frozen tensors still get their gradient computed and the optimizer
    leaves them out, except in a layer holding an adapter (`adapted`: {id(tensor): 1} of the
    LoRA tensors), whose frozen base drops its grad buffer. Returns {id(tensor): 1} of the
    frozen tensors: the trainer's `exclude`."""
    ids = {}
    for p in parts:
        if p.name in frozen:
            for t in p.tensors:
                ids[id(t)] = 1
    layers = []
    for p in parts:
        if p.layer not in layers:
            layers.append(p.layer)
    for layer in layers:
        mine = [q for q, _ in layer.params()]
        layer.trainable = not all(id(q) in ids for q in mine)
        if layer.trainable and adapted and any(id(q) in adapted for q in mine):
            for q, g in layer.params():
                if id(q) in ids:
                    release_grad(g)
            changed()
    return ids


def trainable(parts, frozen):
    """(trainable parameter count, [frozen names] in the model's order)."""
    n = 0
    names = []
    for p in parts:
        if p.name in frozen:
            names.append(p.name)
        else:
            n += p.size
    return n, names
