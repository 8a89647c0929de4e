# microformer.quant: frozen weight matrices stored as int8, one float32 scale per output row.
#
#   w[o, c] = q[o, c] * scale[o]      scale = max_c |w[o, c]| / 127 (float32), q = round(w / scale)
#
# (symmetric; q in [-127, 127]; a row of zeros has scale 0). The int8 weight IS the layer's weight
# from then on: every backend computes with w = q * scale exactly (the portable and NumPy kernels
# form W_deq x; viper multiplies the int8 rows with its block-float inputs, README: Tolerances),
# backward passes the input gradient through it (so LoRA adapters and the layers below train),
# and it never trains itself (it has no grad buffer; unfreezing a layer leaves it frozen).
#
#   from microformer import quant
#   quant.int8(model)                       every frozen Dense / attention / FFN weight matrix
#   quant.int8(model, ["*.linear1.weight"]) those whose state_dict names match (must be frozen)
#   quant.dequantize(model)                 back to float32 (w = q * scale), still frozen
#   quant.is_int8(x)                        an int8 weight, or a layer / model holding one
#   quant.weight_bytes(model)               bytes of every parameter as stored
# Checkpoints carry int8 weights (checkpoint.py, format version 2); loading a file that holds one
# converts that weight of the model to int8 before reading it.
from array import array

from . import backend
from .layer import changed
from .tensor import _MICROPYTHON, Tensor, has_grad, zeros

_Q = 127


def _collect():
    if _MICROPYTHON:
        import gc
        gc.collect()


class Int8Weight:
    """A frozen [out, in] weight matrix: q (array('b'), row-major) and scale (array('f'), one per
    row). Stands where the float32 Tensor stood (same name and shape); its float32 values are not
    kept, so `.data` raises: a path that needs them says so instead of computing something else."""

    int8 = True

    def __init__(self, shape, name="", q=None, scale=None):
        if len(shape) != 2:
            raise ValueError("quant: an int8 weight is a matrix [out, in], got shape %r" % (tuple(shape),))
        self.shape = tuple(shape)
        self.size = shape[0] * shape[1]
        self.name = name
        self.q = array("b", bytes(self.size)) if q is None else q         # (OC, C)
        self.scale = zeros(shape[0]) if scale is None else scale   # (OC,)

    def _no_data(self):
        raise TypeError("quant: weight %r is stored as int8 (quant.int8): its float32 values are not "
                        "kept; quant.dequantize(model) first to change or train it" % self.name)

    data = property(_no_data)

    def nbytes(self):
        return self.size + 4 * self.shape[0]

    def dequantize(self, name=None):
        """A new float32 Tensor w = q * scale."""
        OC, C = self.shape
        t = Tensor(self.shape, name=self.name if name is None else name)
        d = t.data
        q = self.q
        for o in range(OC):
            s = self.scale[o]
            b = o * C
            for c in range(b, b + C):
                d[c] = q[c] * s
        return t

    def tolist(self):
        """The dequantized values as nested lists (what load_state_dict and torch read)."""
        return self.dequantize().tolist()

    def __repr__(self):
        return "Int8Weight(%r, shape=%r)" % (self.name, self.shape)

    # the products, for the layers holding this weight (dense.py, attention.py call them on an
    # int8 weight; they never import this module, so a float32 model never loads it)

    def forward(self, out, inp, bias, N, C, OC):
        """out (N, OC) = inp (N, C) . W^T + bias, W = q * scale."""
        backend.K.q8_matmul_forward(out, inp, self.q, self.scale, bias, N, C, OC)

    def backward(self, dinp, dW, db, dout, inp, N, C, OC):
        """matmul_backward through this weight: dW must be None (an int8 weight never trains)."""
        if dW is not None:
            raise ValueError("quant: int8 weight %r has a grad buffer; an int8 weight never trains" % self.name)
        if dinp is not None:
            backend.K.q8_matmul_backward_input(dinp, dout, self.q, self.scale, N, C, OC, 0)
        if db is not None:
            backend.K.matmul_backward(None, None, db, dout, inp, None, N, C, OC)

    def backward_input_acc(self, dinp, dout, N, C, OC):
        """dinp (N, C) += dout (N, OC) . W."""
        backend.K.q8_matmul_backward_input(dinp, dout, self.q, self.scale, N, C, OC, 1)


def quantize(t, name=None):
    """Int8Weight of a float32 Tensor [out, in] (symmetric, per output row). A NaN or inf is refused."""
    if len(t.shape) != 2:
        raise ValueError("quant: only weight matrices [out, in] are stored as int8, %r has shape %r"
                         % (t.name, tuple(t.shape)))
    OC, C = t.shape
    w = Int8Weight(t.shape, t.name if name is None else name)
    d = t.data
    q = w.q
    sc = w.scale
    for o in range(OC):
        b = o * C
        m = 0.0
        for c in range(b, b + C):
            v = d[c]
            if v - v != 0.0:
                raise ValueError("quant: weight %r holds %r at flat index %d; only finite weights are "
                                 "stored as int8" % (w.name, v, c))
            if v < 0.0:
                v = -v
            if v > m:
                m = v
        sc[o] = m / _Q                     # rounded to float32 here: q is computed with that value
        s = sc[o]
        if s == 0.0:
            continue                       # a zero row: q stays 0
        for c in range(b, b + C):
            q[c] = int(round(d[c] / s))
    return w


def is_int8(x):
    """True for an int8 weight, and for a layer (or a model) that holds at least one."""
    if getattr(x, "int8", False) is True:
        return True
    for _, layer, attr in _slots(x):
        if isinstance(getattr(layer, attr), Int8Weight):
            return True
    return False


# ---- the weight matrices of a model, by state_dict name -------------------------------------

def _slots(model):
    """[(state_dict name, layer, attribute)] of every weight matrix int8 applies to: Dense.W and
    Attention's Wq Wk Wv (named by their in_proj_weight) and Wo (out_proj.weight), in the
    FFN and cross-attention inside blocks too."""
    from .lora import linears
    out = []
    try:
        found = linears(model)
    except (AttributeError, TypeError):
        return out
    for name, _, layer, slot in found:
        if slot is None:
            out.append((name + ".weight" if name else "weight", layer, "W"))
        else:
            pre = name[:name.rfind(".") + 1] if "." in name else ""
            sd = pre + ("out_proj.weight" if slot == "o" else "in_proj_weight")
            out.append((sd, layer, "W" + slot))
    return out


def _grad(layer, attr):
    return getattr(layer, "d" + attr)


def _forget_kept(layer, attr):
    # a backend's prepared copy of the old weight (viper keeps one for decoding)
    keep = layer._wkeep
    if attr == "W":
        keep[0] = None
    else:
        keep["qkvo".index(attr[1])][0] = None


def _chosen(model, parts, who):
    slots = _slots(model)
    if not slots:
        raise ValueError("%s: %s has no Dense or Attention weight matrix" % (who, type(model).__name__))
    if parts is None:
        return slots, False
    if isinstance(parts, str):
        parts = (parts,)
    from .lora import match
    chosen = []
    for p in parts:
        if not isinstance(p, str) or not p:
            raise ValueError("%s: a part must be a state_dict name or glob (a str), got %r" % (who, p))
        hit = [s for s in slots if match(p, s[0])]
        if not hit:
            raise ValueError("%s: %r matches no weight matrix; the model has %s"
                             % (who, p, _unique([s[0] for s in slots])))
        for s in hit:
            if s not in chosen:
                chosen.append(s)
    return chosen, True


def _unique(names):
    out = []
    for n in names:
        if n not in out:
            out.append(n)
    return out


def int8(model, parts=None, show=True):
    """Store frozen weight matrices of `model` as int8 with a scale per output row, in place.

    parts None: every frozen weight matrix (Dense, attention projections, the FFN and
    cross-attention inside blocks); trainable ones are left as they are and listed. parts: state_dict
    names or globs ('0.weight', '*.in_proj_weight', '2.linear1.weight'); each must match, and every
    weight it matches must be frozen (ValueError otherwise, before anything changes).
    Prints (show) and returns [(name, bytes before, bytes after)] of the weights converted.
    """
    chosen, named = _chosen(model, parts, "quant.int8")
    todo = []
    left = []
    for s in chosen:
        name, layer, attr = s
        w = getattr(layer, attr)
        if isinstance(w, Int8Weight):
            continue
        if has_grad(_grad(layer, attr)):
            if named:
                raise ValueError("quant.int8: %s (%s.%s) is trainable: only frozen weights are stored "
                                 "as int8 (freeze it first: layer.trainable = False, mf.add_lora or "
                                 "mf.freeze_except)" % (name, type(layer).__name__, attr))
            if name not in left:
                left.append(name)
            continue
        for i in range(len(w.data)):        # refuse a non-finite weight before anything changes
            v = w.data[i]
            if v - v != 0.0:
                raise ValueError("quant.int8: %s (%s.%s) holds %r at flat index %d; only finite weights "
                                 "are stored as int8" % (name, type(layer).__name__, attr, v, i))
        todo.append(s)
    report = []
    for name, layer, attr in todo:
        # quantize() reads the weight as floats, garbage that moves the heap's allocation point
        # up: collected first, each int8 copy is made at the lowest free address instead of far
        # up the heap, where 13 of them cut the free space into pieces too small for a training
        # step's large buffers (the E=64 encoder's LoRA + int8 fit needed a larger heap than
        # LoRA alone; with this, a smaller one)
        _collect()
        w = getattr(layer, attr)
        qw = quantize(w)
        setattr(layer, attr, qw)
        _forget_kept(layer, attr)
        report.append((name + ("" if attr in ("W", "Wo") else "[%s]" % attr[1]), 4 * w.size, qw.nbytes()))
    changed()
    if show:
        _show(report, left)
    return report


def _show(report, left):
    b = a = 0
    for name, before, after in report:
        b += before
        a += after
        print("  int8 %-28s %7d -> %6d bytes" % (name, before, after))
    if report:
        print("int8: %d weight matrices, %d -> %d bytes (%.2fx smaller)" % (len(report), b, a, b / a))
    else:
        print("int8: nothing converted (no frozen float32 weight matrix left)")
    if left:
        print("int8: trainable, kept float32: %s" % ", ".join(left))


def dequantize(model, parts=None):
    """Back to float32 (w = q * scale) for every int8 weight of `model` (or those matching parts).
    The weights stay frozen. Returns the names converted."""
    chosen, _ = _chosen(model, parts, "quant.dequantize")
    out = []
    for name, layer, attr in chosen:
        w = getattr(layer, attr)
        if isinstance(w, Int8Weight):
            setattr(layer, attr, w.dequantize())
            _forget_kept(layer, attr)
            out.append(name + ("" if attr in ("W", "Wo") else "[%s]" % attr[1]))
    changed()
    return out


def weight_bytes(model):
    """Bytes of every parameter of `model` as stored (float32: 4 per value; int8: 1 + a float32
    scale per row)."""
    n = 0
    for p, _ in model.params():
        n += p.nbytes() if isinstance(p, Int8Weight) else 4 * p.size
    return n


def file_dtypes(named, have, path, model, err):
    """Checkpoint loading (checkpoint.py), every other check passed: the model's tensors as the file
    stores them, and what to install once they are read. A float32 tensor the file holds as int8
    is read into a new int8 weight (make_int8), an int8 weight the file holds as float32 is refused
    (err(path, message)); every tensor is judged before anything is made. Returns (named with the
    new weights, swaps for install()); the model itself is not changed here."""
    want = {}
    for name, p in named:
        i8 = have[name][2] == 1
        if is_int8(p) and not i8:
            raise err(path, "tensor %r is float32 in the file, and the model holds it as int8: "
                      "quant.dequantize(model) first" % name)
        if i8 and not is_int8(p):
            want[id(p)] = name
    if not want:
        return named, ()
    swaps = make_int8(model, want)
    new = {}
    for s in swaps:
        new[s[0]] = s[3]
    for k in want:
        if k not in new:
            raise err(path, "tensor %r is int8 in the file, and the model's %r is not a Dense or "
                      "attention weight matrix (nothing was changed)" % (want[k], want[k]))
    return [(n, new.get(id(p), p)) for n, p in named], swaps


def make_int8(model, ids):
    """Checkpoint loading: for each weight matrix whose current Tensor's id is in `ids`, a new int8
    weight of the same name and shape (zeros, to be read into). Returns the swaps
    [(id(old), layer, attribute, new)] for install(); the model is not changed."""
    out = []
    for _, layer, attr in _slots(model):
        w = getattr(layer, attr)
        if id(w) in ids and not isinstance(w, Int8Weight):
            out.append((id(w), layer, attr, Int8Weight(w.shape, w.name)))
    return out


def install(swaps):
    """Put the int8 weights make_int8 made (and the checkpoint filled) in their layers: an int8
    weight never trains, so its grad buffer goes."""
    for _, layer, attr, qw in swaps:
        setattr(layer, attr, qw)
        _forget_kept(layer, attr)
        g = _grad(layer, attr)
        if has_grad(g):
            g.data = None
    if swaps:
        changed()
