# microformer.model: Sequential, a stack of layers trained together.
from .finite import check_rows
from .layer import Layer, _epoch, partial, prefixed, trains
from .tensor import Tensor


def _down(l, dy, last):
    # one layer's backward in a trainable Sequential: above the lowest trainable layer (last
    # None) with its input gradient; the lowest one with it only when `last` says so
    if last is None:
        return l.backward(dy, True, True) if partial(l) else l.backward(dy)
    if last or not partial(l):
        return l.backward(dy)
    return l.backward(dy, True, False)


class Sequential(Layer):
    """Sequential([layer, ...]): forward in order, backward in reverse."""

    def __init__(self, layers):
        layers = list(layers)
        for i, l in enumerate(layers):
            if not (hasattr(l, "forward") and hasattr(l, "backward") and hasattr(l, "collect_params")):
                raise ValueError("Sequential: layer %d must have forward/backward/collect_params, got %r"
                                 % (i, l))
        self.layers = layers

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def forward(self, x):
        # the model's input is where readings enter: NaN / inf are refused here, naming the
        # example and the feature (a Tensor itself may hold anything, as in torch)
        if isinstance(x, Tensor) and x.shape:
            check_rows("Sequential", x.data, x.size // x.shape[0])
        for l in self.layers:
            x = l.forward(x)
        return x

    backward_stops = True

    def backward(self, dy, grads=True, need_dx=None):
        """Backward from the top layer down to where training stops.

        need_dx=None (the default): down to the lowest layer that trains (a frozen prefix costs
        no backward at all); returns the input gradient when that is layer 0, else None.
        need_dx=True: always down to the input, returning its gradient. need_dx=False: the input
        gradient of the lowest trainable layer is not computed either (returns None). A frozen
        Sequential computes the input gradient unless need_dx is False.
        Frozen layers above the lowest trainable one compute only their input gradient.
        A frozen Sequential (or one inside a frozen layer) keeps every part's grads as they are:
        it calls backward(dy, False); a trainable one calls backward(dy), so a layer of your own
        needs the `grads` argument only to be frozen from outside."""
        # (split in parts so that each frame stays within the 11 words MicroPython keeps off
        # the GC heap: host/tools/frames.py)
        if not (grads and self.trainable):       # frozen: only the input gradient, if wanted
            return None if need_dx is False else self._frozen_backward(dy)
        return self._train_backward(dy, need_dx)

    def _frozen_backward(self, dy):
        L = self.layers
        for i in range(len(L) - 1, -1, -1):
            l = L[i]
            dy = l.backward(dy, False, True) if partial(l) else l.backward(dy, False)
        return dy

    def _train_backward(self, dy, need_dx):
        if need_dx:
            stop = 0
        else:
            stop = self._lowest()
            if stop == len(self.layers):
                return None                       # nothing trains: no backward at all
        need_dx = need_dx or (need_dx is None and stop == 0)    # the input gradient of layers[stop]
        for i in range(len(self.layers) - 1, stop, -1):
            dy = _down(self.layers[i], dy, None)
        dy = _down(self.layers[stop], dy, need_dx)
        return dy if need_dx else None

    def _lowest(self):
        # index of the lowest layer that trains (len(layers): none), kept until a flag changes
        e = _epoch[0]
        if getattr(self, "_low_at", -1) != e:
            L = self.layers
            lo = len(L)
            for i in range(len(L)):
                if trains(L[i]):
                    lo = i
                    break
            self._low = lo
            self._low_at = e
        return self._low

    def sublayers(self):
        return self.layers

    def _named_sublayers(self):
        return [("%d." % i, self.layers[i]) for i in range(len(self.layers))]

    def state_parts(self):
        # nn.Sequential: '<index>.<name>'; parameter-free layers keep their index
        out = []
        for i in range(len(self.layers)):
            out.extend(prefixed("%d." % i, self.layers[i]))
        return out

    def named_params(self):
        """[(name, param)] with names like '2.Wq' (layer index . parameter name)."""
        out = []
        for i, l in enumerate(self.layers):
            for p, _ in l.params():
                out.append(("%d.%s" % (i, p.name), p))
        return out

    def output_shape(self, in_shape):
        for l in self.layers:
            in_shape = l.output_shape(in_shape)
        return in_shape

    def cache_floats(self, in_shape):
        n = 0
        for l in self.layers:
            n += l.cache_floats(in_shape)
            in_shape = l.output_shape(in_shape)
        return n

    def summary(self, input_shape, optimizer_slots=2, show=True):
        """Parameter count and the bytes a training batch of `input_shape` needs (float32).

        optimizer_slots: per-parameter state floats of the optimizer (Adam 2, SGD+momentum 1).
        Grads and optimizer state count for the trainable parameters only. The optimizer also keeps a
        scratch for the new weights and state of a group of trainable tensors (1 + optimizer_slots
        times optim.scratch_stretch floats: a step is all or nothing, optim.py): snapshot_bytes.
        Returns a dict with the totals.
        """
        if not isinstance(input_shape, (tuple, list)) or not input_shape:
            raise ValueError("summary: input_shape must be a tuple like (16, 4) (batch first), got %r"
                             % (input_shape,))
        shape = tuple(input_shape)
        rows = []
        for i, l in enumerate(self.layers):
            if hasattr(l, "check_input_shape"):
                try:
                    l.check_input_shape(shape)
                except ValueError as e:
                    raise ValueError("summary: layer %d gets shape %r from %s: %s"
                                     % (i, shape, "the input" if i == 0 else "layer %d" % (i - 1), e))
            out = l.output_shape(shape)
            rows.append((i, type(l).__name__, out, l.param_count(), l.cache_floats(shape)))
            shape = out
        params = self.param_count()
        from .optim import scratch_stretch
        sizes = [p.size for p, _ in self.collect_params([])]
        live = sum(sizes)
        acts = self.cache_floats(tuple(input_shape))
        snap = 4 * scratch_stretch(sizes) * (1 + optimizer_slots)
        info = {"params": params, "trainable": live,
                # weights; grads + optimizer state of the trainable ones (frozen ones have no grad
                # buffer), and the step's scratch for a group's new weights and state
                "param_bytes": 4 * (params + live * (1 + optimizer_slots)) + snap,
                "snapshot_bytes": snap,
                "activation_bytes": 4 * acts}
        info["total_bytes"] = info["param_bytes"] + info["activation_bytes"]
        if show:
            print("%-3s %-16s %-16s %8s %12s" % ("#", "layer", "output", "params", "act bytes"))
            for i, name, out, n, c in rows:
                print("%-3d %-16s %-16s %8d %12d" % (i, name, str(list(out)), n, 4 * c))
            print("params: %d, %d trainable (%d bytes with grads, optimizer state and the step's "
                  "scratch of %d bytes)" % (params, live, info["param_bytes"], snap))
            print("activations for input %r: %d bytes; total %d bytes"
                  % (list(input_shape), info["activation_bytes"], info["total_bytes"]))
        return info
