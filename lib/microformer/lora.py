# microformer.lora: low-rank adapters (LoRA) on Dense layers and attention projections, and
# freezing by parameter name (bias / LayerNorm-only fine-tuning).
#
#   y = x W^T + b + (alpha / r) (x A^T) B^T       A = lora_A [r, in], B = lora_B [out, r]
#
# peft's conventions: A drawn from U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform with a = sqrt(5), as
# peft), from the default generator (mf.seed), B zero, so a fresh adapter changes nothing.
# state_dict names (PyTorch side):
#   Dense                      '<name>.lora_A.weight', '<name>.lora_B.weight'   (peft's Linear)
#   FeedForward in a block     '<block>.linear1.lora_A.weight', ...            (peft's Linear)
#   Attention out projection   '<attn>.out_proj.lora_A.weight', ...            (peft's Linear)
#   Attention q / k / v        '<attn>.q_proj.lora_A.weight', 'k_proj', 'v_proj': one adapter per
#     projection; nn.MultiheadAttention keeps them as rows of in_proj_weight, so merging into a
#     torch model is  in_proj_weight[0:E] += (alpha/r) * q_B @ q_A  (k: rows E:2E, v: 2E:3E).
#
#   mf.add_lora(model, rank=4, alpha=8, targets=('attention', 'ffn'))   adapters; the rest frozen
#   mf.merge_lora(model)                 fold them into the weights (W += (alpha/r) B A), remove them
#   mf.freeze_except(model, 'bias', 'norm')   bias + LayerNorm fine-tuning (names by pattern)
#   mf.lora.adapters(model), mf.lora.remove_lora(model), mf.lora.trainable_count(model)
# Decoding (decode_step, cross_step) runs on the base weights: merge before generating.
from . import backend
from .layer import Buffered, changed, release_grad, scratch
from .tensor import Grad, Tensor, default_rng, has_grad, settle_gc, unsettle_gc, xavier_uniform

_SLOTS = ("q", "k", "v", "o")
_SLOT_NAMES = {"q": "q_proj.", "k": "k_proj.", "v": "v_proj.", "o": "out_proj."}
KINDS = ("attention", "ffn", "dense")


_ONES = [bytearray(0)]


def _ones(n):
    # a mask of n kept elements: dropout_apply(out, x, ones, n, s) is the backends' out = s x
    # (scale_inplace is a portable loop on viper, which boxes a float per element)
    if len(_ONES[0]) < n:
        _ONES[0] = bytearray(b"\x01" * n)
    return _ONES[0]


_SCRATCH = [None]


def _scratch(n):
    # the (N, out) product h B^T of the adapter running now, outside a frame of the scratch arena
    # (in one: the adapter's _u there): added into y at once and never read again, so one buffer
    # (the largest any adapter needs) serves every adapter of every model
    s = _SCRATCH[0]
    if s is None or len(s) < n:
        s = _SCRATCH[0] = Tensor.zeros((n,), "lora_scratch").data
    return s


class LoRA(Buffered):
    """One adapter on one linear map of in_features -> out_features: rank r, scaling alpha / r."""

    def __init__(self, in_features, out_features, rank, alpha, rng=None):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError("lora: rank must be a positive int, got %r" % (rank,))
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ValueError("lora: alpha must be a positive number, got %r" % (alpha,))
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        self.in_features = in_features
        self.out_features = out_features
        # every array first, then A's draws: the garbage the draws leave (MicroPython) comes after
        # the adapter, not between its arrays, where it would leave holes once collected
        self.A = Tensor((rank, in_features), name="lora_A")
        self.dA = Grad((rank, in_features), "dlora_A")
        self.B = Tensor.zeros((out_features, rank), "lora_B")
        self.dB = Grad((out_features, rank), "dlora_B")
        # kaiming_uniform_(a=sqrt(5)) bound 1/sqrt(in) = sqrt(6 / (in + 5 in)): exact on every port
        xavier_uniform(self.A, in_features, 5 * in_features, rng or default_rng())

    def params(self):
        return ((self.A, self.dA), (self.B, self.dB))

    def state_parts(self):
        return [("lora_A.weight", [self.A]), ("lora_B.weight", [self.B])]

    def _allocate(self, stage, N, other, bufs):
        # keyed by the row count N (an int: no tuple made per call)
        if stage == "_fwd":
            self._h = bufs.zeros("_h", (N, self.rank))              # (alpha/r) x A^T
        elif stage == "_fwu":
            if scratch.depth:                 # h B^T, given back as soon as it is added (forward_add)
                self._u = bufs.scratch("_u", (N, self.out_features))
            else:
                self._u = bufs.none("_u")     # the module's buffer (_scratch)
        else:
            self._dh = bufs.scratch("_dh", (N, self.rank))     # read within backward_add only

    def forward_add(self, y, x, N):
        """y (N, out) += (alpha/r) (x A^T) B^T; keeps (alpha/r) x A^T for backward."""
        K = backend.K
        r = self.rank
        self._buffers("_fwd", N)              # h: kept for backward (before the mark)
        scratch.mark(self)
        self._buffers("_fwu", N)
        h = self._h.data
        u = _scratch(N * self.out_features) if self._u is None else self._u.data   # its product with B^T
        K.matmul_forward(h, x, self.A.data, None, N, self.in_features, r)
        K.dropout_apply(h, h, _ones(N * r), N * r, self.scaling)       # h *= alpha/r
        K.matmul_forward(u, h, self.B.data, None, N, r, self.out_features)
        K.add_forward(y, y, u, N * self.out_features)
        scratch.rewind(self)                  # u (in a frame): nothing reads it now

    def backward_add(self, dy, x, dx, N, train):
        """dB += dy^T h, dA += (alpha/r) (dy B)^T x, dx (N, in) += (alpha/r) (dy B) A (dx None:
        skipped). train False: no grads (a frozen enclosing layer)."""
        K = backend.K
        r = self.rank
        C = self.in_features
        dA = self.dA.data if train else None
        if dA is None and dx is None:
            if train:
                K.matmul_backward(None, self.dB.data, None, dy, self._h.data, self.B.data, N, r,
                                  self.out_features)
            return
        self._buffers("_bwd", N)
        dh = self._dh.data
        K.matmul_backward(dh, self.dB.data if train else None, None, dy, self._h.data, self.B.data, N, r,
                          self.out_features)
        K.dropout_apply(dh, dh, _ones(N * r), N * r, self.scaling)     # dh *= alpha/r
        if dA is not None:
            K.matmul_backward(None, dA, None, dh, x, self.A.data, N, C, r)
        if dx is not None:
            K.matmul_backward_input_acc(dx, dh, self.A.data, N, C, r)

    def backward_grads(self, dy, x, N, train):
        """backward_add's first half (Dense.backward_over_input): dh = (alpha/r) dy B, kept for
        input_acc, and dB += dy^T h, dA += dh^T x when train (the same kernels, the same values)."""
        K = backend.K
        r = self.rank
        self._buffers("_bwd", N)
        dh = self._dh.data
        K.matmul_backward(dh, self.dB.data if train else None, None, dy, self._h.data, self.B.data, N, r,
                          self.out_features)
        K.dropout_apply(dh, dh, _ones(N * r), N * r, self.scaling)     # dh *= alpha/r
        if train and self.dA.data is not None:
            K.matmul_backward(None, self.dA.data, None, dh, x, self.A.data, N, self.in_features, r)

    def input_acc(self, dx, N):
        """backward_add's second half: dx (N, in) += dh A, dh from backward_grads."""
        backend.K.matmul_backward_input_acc(dx, self._dh.data, self.A.data, N, self.in_features, self.rank)

    def merge_into(self, W, row, write=True):
        """W += (alpha/r) B A, a row at a time through `row` (array('f') of in_features or more:
        each new value rounded to float32 as W stores it). write False: nothing is written, and
        the result is the first (row, column) whose new value is not finite in float32, or None."""
        A = self.A.data
        B = self.B.data
        w = W.data
        r = self.rank
        C = self.in_features
        s = self.scaling
        first_nonfinite = backend.K.first_nonfinite
        for o in range(self.out_features):
            base = o * C
            for c in range(C):
                row[c] = w[base + c]
            for k in range(r):
                b = B[o * r + k] * s
                if b != 0.0:
                    ka = k * C
                    for c in range(C):
                        row[c] += b * A[ka + c]
            if write:
                for c in range(C):
                    w[base + c] = row[c]
            else:
                c = first_nonfinite(row, C)
                if c >= 0:
                    return o, c
        return None


# ---- finding the linear maps of a model by name ------------------------------------------

def _children(layer):
    """[(prefix, sublayer)] with the state_dict prefixes (a layer's _named_sublayers, if any)."""
    if hasattr(layer, "_named_sublayers"):
        return layer._named_sublayers()
    return []


def linears(model, prefix=""):
    """Every linear map LoRA can adapt: [(name, kind, layer, slot)]; name is the state_dict-style
    dotted name ('2.self_attn.q_proj', '0.linear1', '3'); kind 'attention', 'ffn' or 'dense';
    slot None for a Dense, 'q' 'k' 'v' 'o' for an Attention's projections."""
    from .attention import Attention
    from .dense import Dense
    from .feedforward import FeedForward
    out = []

    def walk(layer, name, in_ffn):
        if isinstance(layer, Dense):
            out.append((name[:-1] if name.endswith(".") else name, "ffn" if in_ffn else "dense", layer, None))
        elif isinstance(layer, Attention):
            for s in _SLOTS:
                out.append((name + _SLOT_NAMES[s][:-1], "attention", layer, s))
        else:
            ffn = isinstance(layer, FeedForward)
            for p, l in _children(layer):
                walk(l, name + p, in_ffn or ffn)

    walk(model, prefix, False)
    return out


def _tensor_names(model, name, a):
    # the adapter's tensors are named like their layer's own parameters: relative to the model's
    # part that holds them ('self_attn.q_proj.lora_A' in block 2 of a Sequential, whose
    # named_params() then say '2.self_attn.q_proj.lora_A'), so every name in a checkpoint differs
    rel = name
    for p, _ in _children(model):
        if p and (name + ".").startswith(p):
            rel = (name + ".")[len(p):-1]
            break
    for t, what in ((a.A, "lora_A"), (a.dA, "dlora_A"), (a.B, "lora_B"), (a.dB, "dlora_B")):
        t.name = rel + "." + what if rel else what


def match(pattern, name):
    """Glob with '*' (any run of characters, dots included) against a whole dotted name."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == name
    if not name.startswith(parts[0]):
        return False
    pos = len(parts[0])
    for i in range(1, len(parts) - 1):
        j = name.find(parts[i], pos)
        if j < 0:
            return False
        pos = j + len(parts[i])
    last = parts[-1]
    return len(name) - pos >= len(last) and name.endswith(last)


def add_lora(model, rank=4, alpha=8, targets=("attention", "ffn"), rng=None):
    """Add LoRA adapters to the model's linear maps named by `targets` and freeze everything else.

    targets: kinds ('attention': every attention's q/k/v/out projections, cross-attention
    included; 'ffn': the linears of the feed-forward networks; 'dense': the other Dense layers)
    and/or state_dict-style names or globs of linear maps ('2.self_attn.q_proj', '*.linear1',
    '4'; see linears(model)). A target that matches nothing is an error.
    Every parameter outside the adapters is frozen (no grad buffer); unfreeze the head afterwards
    if it should train too (model[-1].trainable = True: every parameter inside a layer set
    trainable trains, base weights of an adapted layer included). Returns [(name, LoRA)] of the
    adapters.
    """
    picked = chosen(model, targets)
    for name, _, layer, slot in picked:
        if _get(layer, slot) is not None:
            raise ValueError("lora: %s already has an adapter (mf.merge_lora(model) or mf.lora.remove_lora(model) first)" % name)
    keep = {}                            # adapters added before keep training
    for _, a in adapters(model):
        keep[id(a.dA)] = 1
        keep[id(a.dB)] = 1
    for _, g in model.params():          # freeze everything else, then the new adapters train
        if id(g) not in keep:
            release_grad(g)
    old = settle_gc()                    # each adapter next to the last, not above its garbage
    try:
        out = _add(model, picked, rank, alpha, rng)
    finally:
        unsettle_gc(old)
    _settle(model)
    changed()
    return out


def _add(model, picked, rank, alpha, rng):
    out = []
    for name, _, layer, slot in picked:
        if slot is None:
            a = LoRA(layer.in_features, layer.out_features, rank, alpha, rng)
            layer.lora = a
        else:
            E = layer.embed_dim
            a = LoRA(E, E, rank, alpha, rng)
            setattr(layer, "lora_" + slot, a)
        _tensor_names(model, name, a)
        layer._trainable = True          # its base stays frozen (no grad buffer); the adapter trains
        out.append((name, a))
    return out


def chosen(model, targets):
    """The linear maps [(name, kind, layer, slot)] that `targets` (kinds and/or names or globs, see
    add_lora) name, in the order named; ValueError when one matches nothing. Changes nothing."""
    if isinstance(targets, str):
        targets = (targets,)
    targets = list(targets)
    if not targets:
        raise ValueError("lora: targets must name at least one kind %s or linear map, got []" % (KINDS,))
    found = linears(model)
    if not found:
        raise ValueError("lora: %s has no Dense or Attention layer to adapt" % type(model).__name__)
    out = []
    for t in targets:
        if not isinstance(t, str):
            raise ValueError("lora: a target must be a string (a kind %s or a name), got %r" % (KINDS, t))
        hit = [f for f in found if f[1] == t] if t in KINDS else [f for f in found if match(t, f[0])]
        if not hit:
            raise ValueError("lora: target %r matches no linear map; the model has %s"
                             % (t, [f[0] for f in found]))
        for f in hit:
            if f not in out:
                out.append(f)
    return out


def _get(layer, slot):
    return layer.lora if slot is None else getattr(layer, "lora_" + slot)


def adapters(model):
    """[(name, LoRA)] of every adapter in the model."""
    out = []
    for name, _, layer, slot in linears(model):
        a = _get(layer, slot)
        if a is not None:
            out.append((name, a))
    return out


def merge_lora(model):
    """Fold every adapter into its base weight (W += (alpha/r) B A) and remove the adapters: the
    model then runs as a plain one (decoding included). The merged weights stay frozen as they
    were. Returns the number of adapters merged."""
    n = 0
    C = 0
    for name, _, layer, slot in linears(model):       # checked before anything changes
        a = _get(layer, slot)
        if a is not None and getattr(layer, "W" if slot is None else "W" + slot).__class__ is not Tensor:
            raise ValueError("merge_lora: the base weight of %s is int8 (quant.int8), which cannot hold "
                             "W + (alpha/r) B A; quant.dequantize(model) first, then merge (and "
                             "quant.int8 again if wanted)" % name)
        if a is not None and a.in_features > C:
            C = a.in_features
    row = Tensor.zeros((C,), "merge_row").data if C else None
    for name, _, layer, slot in linears(model):       # every new weight finite in float32
        a = _get(layer, slot)
        if a is not None:
            bad = a.merge_into(layer.W if slot is None else getattr(layer, "W" + slot), row, False)
            if bad is not None:
                raise ValueError("merge_lora: %s: W + (alpha/r) B A is not finite in float32 at row %d, "
                                 "column %d (%s); nothing was merged" % (name, bad[0], bad[1], row[bad[1]]))
    for name, _, layer, slot in linears(model):
        a = _get(layer, slot)
        if a is None:
            continue
        if slot is None:
            a.merge_into(layer.W, row)
            layer.lora = None
            layer._wkeep[0] = None               # a backend's prepared copy of the old W
        else:
            a.merge_into(getattr(layer, "W" + slot), row)
            setattr(layer, "lora_" + slot, None)
            layer._wkeep[_SLOTS.index(slot)][0] = None
        n += 1
    changed()
    return n


def spec_groups(model):
    """The model's adapters as a spec describes them: [{"rank", "alpha", "targets": [names]}], one
    entry per (rank, alpha) in the model's order; [] without adapters."""
    out = []
    for name, a in adapters(model):
        for g in out:
            if g["rank"] == a.rank and g["alpha"] == a.alpha:
                g["targets"].append(name)
                break
        else:
            out.append({"rank": a.rank, "alpha": a.alpha, "targets": [name]})
    return out


def remove_lora(model):
    """Drop every adapter without merging it (the base model as it was). Returns how many."""
    n = 0
    for name, _, layer, slot in linears(model):
        if _get(layer, slot) is not None:
            if slot is None:
                layer.lora = None
            else:
                setattr(layer, "lora_" + slot, None)
            n += 1
    changed()
    return n


# ---- freezing by parameter name -------------------------------------------------------------

def freeze_except(model, *patterns):
    """Train only the parameters whose state_dict name matches one of `patterns`; freeze (drop the
    grad buffer of) every other one. A pattern with '*' is a glob on the whole name; without, a
    substring of it: freeze_except(model, 'bias', 'norm') is bias + LayerNorm fine-tuning
    (names such as '0.bias', '2.self_attn.in_proj_bias', '2.norm1.weight'). A pattern that
    matches nothing is an error. Returns the names of the trainable tensors, in the model's order."""
    if not patterns:
        raise ValueError("freeze_except: give at least one name pattern, e.g. 'bias', 'norm'")
    entries = model.state_parts()
    live = []
    keep = set()
    for pat in patterns:
        if not isinstance(pat, str) or not pat:
            raise ValueError("freeze_except: a pattern must be a non-empty string, got %r" % (pat,))
        hit = False
        for name, parts in entries:
            if (match(pat, name) if "*" in pat else pat in name):
                hit = True
                if name not in live:
                    live.append(name)
                for p in parts:
                    keep.add(id(p))
        if not hit:
            raise ValueError("freeze_except: %r matches no parameter; the names are %s"
                             % (pat, [n for n, _ in entries]))
    model.trainable = True                       # flags on, every grad buffer back ...
    _unflag(model)
    for p, g in model.params():                  # ... then all but the kept ones dropped
        if id(p) not in keep:
            release_grad(g)
    _settle(model)
    changed()
    return [n for n, _ in entries if n in live]          # in the model's order


def _unflag(layer):
    # every layer inside trainable again (a frozen part keeps its buffers dropped otherwise)
    if hasattr(layer, "sublayers"):
        for l in layer.sublayers():
            if not getattr(l, "trainable", True):
                l.trainable = True
            _unflag(l)


def _settle(layer):
    # a plain layer none of whose parameters trains is marked frozen (trainable False): layers
    # whose backward uses its single grad whenever trainable (Embedding) then skip it
    subs = layer.sublayers() if hasattr(layer, "sublayers") else ()
    if subs:
        for l in subs:
            _settle(l)
    elif hasattr(layer, "params"):
        pairs = layer.params()
        if pairs and getattr(layer, "trainable", False):
            for _, g in pairs:
                if has_grad(g):
                    return
            layer.trainable = False


def trainable_count(model):
    """Parameters that train (have a grad buffer)."""
    n = 0
    for p, _ in model.collect_params([]):
        n += p.size
    return n

