# microformer.statedict: Layer.load_state_dict, loaded on first use (a model that never takes
# PyTorch's weights, as a board session loading its checkpoint, never imports it).
from .tensor import Tensor


def load(layer, state_dict, strict=True):
    # Layer.load_state_dict: every key, shape and value is checked before any weight changes
    who = "%s.load_state_dict" % type(layer).__name__
    if not hasattr(state_dict, "items"):
        raise ValueError("%s: expected a dict of name -> tensor, got %s" % (who, type(state_dict).__name__))
    entries = layer.state_parts()
    names = [n for n, _ in entries]
    missing = [n for n in names if n not in state_dict]
    unexpected = [k for k in state_dict if k not in names]
    if strict and (missing or unexpected):
        raise ValueError("%s: missing keys %s, unexpected keys %s (expected exactly %s)"
                         % (who, missing, unexpected, names))
    staged = []
    for name, parts in entries:
        if name not in state_dict:
            continue
        for p in parts:
            if p.__class__.__name__ == "Int8Weight":        # (no import: quant stays unloaded)
                raise TypeError("%s: %r is stored as int8 (quant.int8) and cannot take float32 "
                                 "values; quant.dequantize(model) first (nothing was loaded)" % (who, name))
        t = _as_tensor(state_dict[name], who, name)
        want = (sum(p.shape[0] for p in parts),) + tuple(parts[0].shape[1:])
        if tuple(t.shape) != want:
            raise ValueError("%s: %r has shape %s, expected %s" % (who, name, list(t.shape), list(want)))
        d = t.data
        for i in range(len(d)):
            v = d[i]
            if v - v != 0.0:
                raise ValueError("%s: %r holds a non-finite value (%r at flat index %d)" % (who, name, v, i))
        staged.append((parts, d))
    for parts, d in staged:          # everything checked: now write
        off = 0
        for p in parts:
            n = p.size
            p.data[0:n] = d[off:off + n]
            off += n
    return missing, unexpected


def _as_tensor(v, who, name):
    if isinstance(v, Tensor):
        return v
    if hasattr(v, "tolist"):                    # NumPy arrays, torch tensors
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        try:
            return Tensor.from_list(v)
        except (ValueError, TypeError) as e:
            raise ValueError("%s: %r is not a rectangular list of numbers (%s)" % (who, name, e))
    raise ValueError("%s: %r must be a Tensor, a nested list or have .tolist(), got %s"
                     % (who, name, type(v).__name__))
