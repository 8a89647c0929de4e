# microformer.layer: the base class every layer derives from (the layer contract), and
# state_dict / load_state_dict with PyTorch's parameter names and layouts.

from . import backend
from . import tensor as _tensor
from .lazy import sibling
from .tensor import Tensor, has_grad

try:
    from collections import OrderedDict as _Ordered
except ImportError:          # a MicroPython without OrderedDict: a plain dict
    _Ordered = dict


_KEYS = 4                    # keys (batch shapes) whose buffers a stage keeps


class Scratch:
    """The shared scratch arena: buffers that nothing reads once a frame is over.

    A frame is a stretch of code (EncoderBlock.backward) after which only its own buffers are
    read; inside it, the layers' scratch buffers (`bufs.scratch(name, shape)`: the backward
    temporaries and input gradients of the parts of a block) are placed one after another in the
    arena's arrays, in the order they are asked for, and the next frame places its own at the same
    offsets again. So the blocks of a model share one set of backward buffers (the arena holds the
    largest frame), and a frame can give back what it placed after a point (`mark` / `rewind`) once
    nothing it placed there is read any more. Outside every frame a scratch buffer is an array of
    its own, as `bufs.zeros` makes. A key (Buffers) records where its scratch buffers were placed
    (arena generation, cursor before and after); every `_buffers` call checks that the cursor is
    there and moves it on, and places them again when it is not (a frame that asks in another
    order, a key made outside a frame): two buffers live in one frame never share an element.
    The contents of a scratch buffer are undefined when a pass starts: a layer writes it before it
    reads it."""

    def __init__(self):
        self.chunks = []          # float32 arrays; a buffer is a view on one of them
        self.depth = 0            # frames open (nested frames share the outermost one's arena)
        self.ci = 0               # the cursor: chunk index and offset in it
        self.off = 0
        self.gen = 0              # bumped when the chunks are dropped: every placement is stale
        self.every = 0            # > 0 in a frame: every float32 buffer a key makes is placed in
                                  # the arena (a checkpointed block's parts: EncoderBlock.checkpoint)

    def enter(self):
        if not self.depth:
            self.ci = 0
            self.off = 0
        self.depth += 1

    def leave(self):
        self.depth -= 1

    def mark(self, holder):
        """Store the cursor on `holder` (its _sci, _soff): rewind(holder) gives back what follows."""
        holder._sci = self.ci
        holder._soff = self.off

    def rewind(self, holder):
        self.ci = holder._sci
        self.off = holder._soff

    def take(self, n):
        """n float32 values: a view at the cursor (in a frame), else an array of its own."""
        if not self.depth:
            return _tensor.zeros(n)
        ch = self.chunks
        while self.ci < len(ch):
            c = ch[self.ci]
            o = self.off
            if len(c) - o >= n:
                self.off = o + n
                return c if o == 0 and len(c) == n else memoryview(c)[o:o + n]
            self.ci += 1
            self.off = 0
        c = _tensor.zeros(n)                      # a new chunk of this buffer's size
        ch.append(c)
        self.ci = len(ch) - 1
        self.off = n
        return c

    def nbytes(self):
        """Bytes the arena's arrays hold."""
        return 4 * sum(len(c) for c in self.chunks)

    def free(self):
        """Drop the arena's arrays (outside a frame): every layer places its scratch again on its
        next pass, and the arrays go once no layer's view holds them."""
        if self.depth:
            raise RuntimeError("Scratch.free: a frame is open")
        self.chunks = []
        self.gen += 1


scratch = Scratch()          # the one arena


class Buffers:
    """The buffers one stage of one layer holds for one key (shape, other), asked for by name.

    A layer's `_allocate(stage, shape, other, bufs)` makes them and stores each on itself under
    the name it gives: `self._y = bufs.zeros('_y', (B, F))`, `self._keep = bufs.bytes('_keep', n)`.
    The set records the names and values; when the layer switches back to this key it stores them
    on the layer again and zeroes them. Float32 buffers are drawn on the stage's arrays (shared by
    the stage's keys): the i-th one asked for is a view on the first values of the stage's i-th
    array when that one is large enough, else a new array that replaces it (the stage's other keys
    are dropped first: they may hold views on the array replaced)."""

    def __init__(self, stage, shape, other):
        self._stage = stage          # the layer's stage: [arrays, names, keys]
        self.shape = shape           # the key
        self.other = other
        self.names = []              # the names asked for, in order, and their values
        self.values = []
        self.floats = []             # float32 data (arrays or views), zeroed on each switch
        self.own = []                # this key's own bytearrays and int arrays, zeroed likewise
        self.scr = []                # the scratch buffers: [index in names, shape, size]
        self.gen = self.ci = self.off = self.eci = self.eoff = -1    # their placement (Scratch)

    def _add(self, name, value):
        if name in self.names:
            raise ValueError("Buffers: %r asked for twice for one key (%r, %r)" % (name, self.shape, self.other))
        self.names.append(name)
        self.values.append(value)
        return value

    def zeros(self, name, shape):
        """A float32 Tensor of `shape`, zeros, named `name`: self.<name> holds it (in the arena,
        as `scratch` places it, while Scratch.every is set in a frame)."""
        if scratch.every and scratch.depth:
            return self.scratch(name, shape)
        shape = _tensor._check_shape(shape, "Buffers.zeros(%r)" % name)
        n = _tensor.shape_size(shape)
        arrays = self._stage[0]
        i = len(self.floats)
        if i < len(arrays) and len(arrays[i]) >= n:
            a = arrays[i]
            data = a if len(a) == n else memoryview(a)[:n]
        else:
            data = _tensor.zeros(n)
            del self._stage[2][:]
            if i < len(arrays):
                arrays[i] = data
            else:
                arrays.append(data)
        self.floats.append(data)
        return self._add(name, Tensor(shape, data))

    def scratch(self, name, shape):
        """A float32 Tensor of `shape` in the shared arena (Scratch), named `name`: for buffers
        that nothing reads after the frame they are used in (a block's backward). Its values are
        undefined when a pass starts (zeros only when just placed); outside a frame it is what
        `zeros` gives (the stage's arrays)."""
        shape = _tensor._check_shape(shape, "Buffers.scratch(%r)" % name)
        n = _tensor.shape_size(shape)
        if not self.scr:
            self._start()
        self.scr.append([len(self.names), shape, n])
        if self.ci < 0:
            return self.zeros(name, shape)
        t = self._add(name, Tensor(shape, scratch.take(n)))
        backend.K.zero(t.data, n)
        self._end()
        return t

    def _start(self):
        S = scratch
        self.gen = S.gen
        self.ci = S.ci if S.depth else -1         # -1: own arrays (made outside a frame)
        self.off = S.off

    def _end(self):
        self.eci = scratch.ci
        self.eoff = scratch.off

    def _at(self):
        # the steady state: are this key's scratch buffers where the cursor is? then move it on
        S = scratch
        if self.ci < 0:
            return not S.depth
        if not S.depth or S.gen != self.gen or S.ci != self.ci or S.off != self.off:
            return False
        S.ci = self.eci
        S.off = self.eoff
        return True

    def _place(self, layer):
        # the scratch buffers taken again at the cursor, stored on the layer, zeroed (a key made
        # outside a frame and used outside one keeps its arrays: _zero cleared them; one made in
        # a frame and used outside gets arrays of its own)
        if self.ci < 0 and not scratch.depth:
            return
        self._start()
        K = backend.K
        for e in self.scr:
            t = Tensor(e[1], scratch.take(e[2]))
            self.values[e[0]] = t
            setattr(layer, self.names[e[0]], t)
            K.zero(t.data, e[2])
        self._end()

    def bytes(self, name, n):
        """A bytearray of n zeros (masks, flags) of this key's own."""
        b = bytearray(n)
        self.own.append(b)
        return self._add(name, b)

    def ints(self, name, n):
        """An array('i') of n zeros (indices) of this key's own."""
        a = _tensor.zeros(n, "i")
        self.own.append(a)
        return self._add(name, a)

    def view(self, name, t):
        """A Tensor the layer made itself (a view on another's data): kept, never zeroed."""
        return self._add(name, t)

    def none(self, name):
        """No buffer under `name` for this key (self.<name> is None)."""
        return self._add(name, None)

    def _restore(self, layer):
        names = self.names
        values = self.values
        for j in range(len(names)):
            setattr(layer, names[j], values[j])
        self._zero()
        if self.scr:
            self._place(layer)

    def _zero(self):
        # float32 buffers by the backend's kernel; bytearrays and int arrays element by element
        K = backend.K
        for f in self.floats:
            K.zero(f, len(f))
        for b in self.own:
            for i in range(len(b)):
                b[i] = 0


_UNSET = object()


class Buffered:
    """The one way layers and losses reuse their output, cache and gradient buffers (and views).

    A method runs `self._buffers(stage, shape, other)` before it writes its buffers: `stage` names
    the buffers of one pass ('_fwd', '_bwd', ...; the attribute that holds their Buffers), `shape`
    and `other` are what their sizes follow (an input shape; a second input's shape, a capacity or
    None). While the key is the one in use, nothing happens: a steady-state step compares tuples
    and allocates nothing. On another key the buffers are zeros again, as if new:

    - a key seen before (each stage keeps its last _KEYS) gets its buffers back, zeroed;
    - a new key runs `self._allocate(stage, shape, other, bufs)`, which asks the new key's
      Buffers `bufs` for every buffer by name and stores it on the layer under that name
      (`self._y = bufs.zeros('_y', shape)`); float32 buffers are views on the first values of
      the stage's arrays when those are large enough (so the smaller last batch of an epoch runs
      on views of the full batch's arrays), else new arrays that replace them (and the other keys
      are dropped, to be made again).

    So a fit loop whose last batch is smaller allocates nothing at steady state, epoch boundaries
    included. The key is cleared before the buffers change and set only once they are complete:
    a MemoryError or a KeyboardInterrupt at any point leaves the stage to be switched again.
    """

    def _buffers(self, stage, shape, other=None):
        # the steady state compares and returns (a frame of 10 words: no heap frame per call)
        # (a key with scratch buffers also checks and moves the arena's cursor: Scratch)
        have = getattr(self, stage, None)
        if have is None or have.shape != shape or have.other != other or (have.scr and not have._at()):
            self._rebuffer(stage, shape, other)

    def _rebuffer(self, stage, shape, other):
        setattr(self, stage, None)
        setattr(self, stage, self._switch(stage, shape, other))

    def _switch(self, stage, shape, other):
        # per stage: [arrays, names, keys]: the float32 arrays its keys draw on, the names every
        # kept key holds, the kept keys' Buffers (the most recently used last)
        stages = getattr(self, "_stages", None)
        if stages is None:
            stages = self._stages = {}
        st = stages.get(stage)
        if st is None:
            st = stages[stage] = [[], [], []]
        keys = st[2]
        for i in range(len(keys)):
            k = keys[i]
            if k.shape == shape and k.other == other:
                if i < len(keys) - 1:
                    keys.append(keys.pop(i))
                k._restore(self)
                return k
        k = Buffers(st, shape, other)
        self._allocate(stage, shape, other, k)
        names = k.names
        for j in range(len(names)):
            if getattr(self, names[j], _UNSET) is not k.values[j]:
                raise RuntimeError("%s._allocate: buffer %r is not stored as self.%s"
                                   % (type(self).__name__, names[j], names[j]))
        if names != st[1]:
            del keys[:]                           # they hold other names
            st[1] = names
        k._zero()
        if len(keys) >= _KEYS:
            del keys[0]
        keys.append(k)
        return k

    def _allocate(self, stage, shape, other, bufs):
        raise NotImplementedError("%s: no buffers for stage %r" % (type(self).__name__, stage))


class Layer(Buffered):
    """y = forward(x); dx = backward(dy, grads=True); collect_params(groups).

    backward returns the gradient of the input (a Tensor shaped as x) or None when it has none
    (token ids; need_dx=False): never a tuple; a second input's gradient is an attribute set by
    backward (Attention.dcontext, DecoderBlock.dmemory).

    backward adds into the parameter grads when `grads` is true and the layer is trainable; a
    frozen enclosing layer (a Sequential, a composite such as EncoderBlock) passes grads=False so
    that a frozen part's grads stay as they are. A composite lists its parts in sublayers():
    then collect_params, params and train go through them, and freezing any part (or the whole)
    works as in Sequential; no flag is ever changed by backward.
    """

    training = True
    _trainable = True
    _out_scratch = False       # True: the output `_y` is a scratch buffer (read inside the enclosing frame only)
    backward_stops = False     # True: backward(dy, grads, need_dx) can skip the input gradient

    def _get_trainable(self):
        return self._trainable

    def _set_trainable(self, flag):
        # freezing drops the grad buffers of every parameter inside; unfreezing gives every
        # parameter whose layers (inside this one) are trainable a zeroed grad buffer again
        if flag is not True and flag is not False:
            raise ValueError("%s: trainable must be True or False, got %r" % (type(self).__name__, flag))
        self._trainable = flag
        if flag:
            _grads_on(self)
        else:
            for _, g in self.params():
                release_grad(g)
        changed()

    trainable = property(_get_trainable, _set_trainable)

    def _trains(self):
        """True when a backward with grads would add into some grad buffer of this layer."""
        if not self._trainable:
            return False
        subs = self.sublayers()
        if subs:
            for l in subs:
                if trains(l):
                    return True
            return False
        for _, g in self.params():
            if has_grad(g):
                return True
        return False

    def _allocate(self, stage, shape, other, bufs):
        # the common case: the output `_y` for the forward pass ('_fwd', at output_shape), the input
        # gradient `_dx` for any other stage; layers with more buffers define their own
        if stage == "_fwd":
            if self._out_scratch:
                self._y = bufs.scratch("_y", self.output_shape(shape))
            else:
                self._y = bufs.zeros("_y", self.output_shape(shape))
        else:
            self._dx = bufs.scratch("_dx", shape)

    def sublayers(self):
        """The parts of a composite layer, in order (empty for a plain layer)."""
        return ()

    def collect_params(self, groups):
        """Append the (param, grad) Tensor pairs this layer trains to `groups`; return it. A frozen
        layer adds none; a composite adds those of its trainable parts."""
        if self.trainable:
            subs = self.sublayers()
            if subs:
                for l in subs:
                    l.collect_params(groups)
            else:
                for pair in self.params():
                    if has_grad(pair[1]):             # a frozen parameter has no grad buffer
                        groups.append(pair)
        return groups

    def params(self):
        """Every (param, grad) pair, frozen or not (what a checkpoint saves)."""
        out = []
        for l in self.sublayers():
            out.extend(l.params())
        return out

    def parameters(self):
        """The trainable (param, grad) pairs, for an optimizer: Adam(model.parameters(), lr=...)."""
        return self.collect_params([])

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- state_dict: PyTorch's names and layouts ---------------------------------------

    def state_parts(self):
        """[(name, [param Tensors])] in the order and with the names of the PyTorch module this
        layer mirrors; an entry of several Tensors is their concatenation along dimension 0
        (e.g. Attention's in_proj_weight = [Wq; Wk; Wv])."""
        return []

    def state_dict(self):
        """Ordered {name: Tensor}, named as in PyTorch (nn.Linear: 'weight' [out,in], 'bias').
        A value is the parameter itself where the layouts agree, a concatenated copy otherwise."""
        sd = _Ordered()
        for name, parts in self.state_parts():
            sd[name] = parts[0] if len(parts) == 1 else _concat(parts)
        return sd

    def load_state_dict(self, state_dict, strict=True):
        """Load weights named as state_dict() names them. Values: Tensors, nested lists, or
        anything with .tolist() (NumPy arrays, torch tensors). Every key, shape and value is
        checked before any weight changes; missing or unexpected keys raise ValueError when
        strict. Returns (missing_keys, unexpected_keys)."""
        # (statedict.py, loaded on first use: a model that never takes PyTorch's weights never loads it)
        return sibling("statedict", "load_state_dict").load(self, state_dict, strict)

    def train(self, mode=True):
        self.training = mode
        for l in self.sublayers():
            l.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def param_count(self):
        n = 0
        for p, _ in self.params():
            n += p.size
        return n

    def output_shape(self, in_shape):
        return in_shape

    def check_input_shape(self, in_shape):
        """ValueError naming the layer and the expected vs given shape (summary() calls it)."""
        if not isinstance(in_shape, tuple) or not in_shape:
            raise ValueError("%s: input shape must be a non-empty tuple like (B, F), got %r"
                             % (type(self).__name__, in_shape))

    def cache_floats(self, in_shape):
        """Floats of output and cache buffers a forward + backward at `in_shape` holds."""
        return 0

    def _need_forward(self, cached):
        if cached is None:
            raise RuntimeError("%s: backward() called before forward()" % type(self).__name__)



class WeightBias(Layer):
    """A layer whose parameters are a weight W (its grad dW) and, with use_bias, a bias b (db),
    named as PyTorch names them ('weight', 'bias': nn.Linear, nn.Conv1d)."""

    def params(self):
        if self.use_bias:
            return ((self.W, self.dW), (self.b, self.db))
        return ((self.W, self.dW),)

    def state_parts(self):
        return [("weight", [self.W])] + ([("bias", [self.b])] if self.use_bias else [])

def release_buffers(layer, _keep=None, _all=False):
    """Drop the output, cache and gradient buffers `layer` and every part inside it hold (each
    stage's buffer sets, the attributes they fill, and the Tensors a pass keeps for the next,
    such as its input): the next pass makes them again. Parameters and their grads stay. A fit
    that failed gives its memory back with it (train.Trainer)."""
    if _keep is None:
        _keep = {}
        if hasattr(layer, "params"):
            for p, g in layer.params():
                _keep[id(p)] = 1
                _keep[id(g)] = 1
    if id(layer) in _keep:              # seen (a part pointing back to its layer)
        return
    _keep[id(layer)] = 1
    stages = getattr(layer, "_stages", None)
    if stages:
        for stage in stages:
            setattr(layer, stage, None)
        layer._stages = None
    d = getattr(layer, "__dict__", None)
    if not d:
        return
    for name in list(d):
        v = d[name]
        if isinstance(v, Tensor):
            # a layer's own buffers and caches have private names (a fixed table such as
            # PositionalEncoding.pe does not); a projection part keeps only operands
            if id(v) not in _keep and (_all or name[0] == "_"):
                setattr(layer, name, None)
        elif isinstance(v, Buffered):
            release_buffers(v, _keep)
        elif isinstance(v, bytearray):
            if name[0] == "_":                  # a stage's byte buffer (Attention's mask bytes)
                setattr(layer, name, None)
        elif isinstance(v, (list, tuple)):
            if name == "_wkeep":                # a backend's prepared copies of weights (boxes)
                _empty(v)
            elif name == "_views" or name == "_mview":   # views on the buffers (Attention's items)
                setattr(layer, name, [] if name == "_views" else None)
                continue
            for x in v:
                if isinstance(x, Buffered):
                    release_buffers(x, _keep)
        elif hasattr(v, "inp") and hasattr(v, "out") and hasattr(v, "__dict__"):
            # a part that keeps a pass's operands (Attention's projections): drop those
            release_buffers(v, _keep, True)


def drop_scratch():
    """Give back the kernels' scratch (grown on demand to the largest call so far and kept):
    the viper kernels' blocks (viper_common, viper_conv) and the adapters' product (lora), of
    the modules loaded, and the blocks' scratch arena (layer.scratch) when no frame is open."""
    if not scratch.depth:
        scratch.free()
    import sys
    m = sys.modules
    vc = m.get("microformer.viper_common")
    if vc is not None:
        for box, code in ((vc._S, "i"), (vc._F, "f"), (vc._G, "f")):
            if box[0] is None or len(box[0]) > 64:     # None: a MemoryError while it grew
                box[0] = None
                box[0] = vc._filled(code, 64, 0)
    cv = m.get("microformer.viper_conv")
    if cv is not None:
        for i in range(len(cv._CV)):
            if cv._CV[i] is None or len(cv._CV[i]) > 16:
                cv._CV[i] = None
                cv._CV[i] = _tensor.zeros(16)
    lo = m.get("microformer.lora")
    if lo is not None:
        lo._SCRATCH[0] = None


def train_backward(model, dy):
    """The model's backward from a loss's gradient dy in training: a model whose backward takes
    need_dx (partial(): Sequential and the library's layers) skips the input gradient nobody
    reads (train.Trainer and the memory plan's probes)."""
    if partial(model):
        model.backward(dy, True, False)
    else:
        model.backward(dy)


def _empty(boxes):
    # [x] -> [None]; ([x], [y], ...) -> ([None], [None], ...)
    if isinstance(boxes, list):
        boxes[0] = None
    else:
        for b in boxes:
            b[0] = None


# ---- frozen parameters hold no grad buffer ---------------------------------------------
# A parameter is frozen when its grad Tensor's data is None (released); a kernel given None for
# a grad skips it. Every change of a flag or a buffer bumps _epoch, so a Sequential knows when to
# find its lowest trainable layer again (without walking its layers on every step).
_epoch = [0]


def changed():
    _epoch[0] += 1


def release_grad(g):
    """Drop a parameter's grad buffer (or the one its first use would make): the parameter is
    frozen."""
    if has_grad(g):
        g.data = None
        changed()


def ensure_grad(p, g):
    """Let a frozen parameter train again: its grad buffer (zeros) is made on first use (a Grad:
    the next backward or step), or now for a plain Tensor. No-op for a trainable one, and for an
    int8 weight, which never trains: quant.py."""
    if not has_grad(g) and getattr(p, "int8", False) is not True:
        if hasattr(g, "wake"):
            g.wake()
        else:
            g.data = _tensor.zeros(p.size)
        changed()


def grad_floats(layer):
    """Floats of the gradient buffers layer (a model) holds now: a Grad has one only from its
    first use (the first backward that trains it, or a step) until it is frozen."""
    n = 0
    for _, g in layer.params():
        d = g._d if hasattr(g, "lazy") else g.data
        if d is not None:
            n += len(d)
    return n


def _grads_on(layer):
    if not getattr(layer, "trainable", True):
        return
    subs = layer.sublayers() if hasattr(layer, "sublayers") else ()
    if subs:
        for l in subs:
            _grads_on(l)
    elif hasattr(layer, "params"):
        for p, g in layer.params():
            ensure_grad(p, g)


def trains(layer):
    """Would layer.backward(dy) add into a grad? A layer of one's own (no _trains) is assumed to.
    The answer is kept until a flag or a grad buffer changes (no walk, no allocation per step)."""
    if not hasattr(layer, "_trains"):
        return True
    e = _epoch[0]
    if getattr(layer, "_trains_at", -1) != e:
        layer._trains_now = layer._trains()
        layer._trains_at = e
    return layer._trains_now


def partial(layer):
    """Does layer.backward take need_dx (backward(dy, grads, need_dx=False) skips the input grad)?"""
    return getattr(layer, "backward_stops", False)


def _concat(parts):
    shape = (sum(p.shape[0] for p in parts),) + tuple(parts[0].shape[1:])
    out = Tensor(shape)
    off = 0
    for p in parts:
        out.data[off:off + p.size] = p.dequantize().data if getattr(p, "int8", False) is True else p.data
        off += p.size
    return out


def prefixed(prefix, layer):
    """layer.state_parts() with every name prefixed (composites and Sequential)."""
    return [(prefix + n, parts) for n, parts in layer.state_parts()]


def shape_error(layer, what, expected, got):
    return ValueError("%s: %s must be %s, got %r" % (layer, what, expected, tuple(got)))


def check_tensor(layer, what, x):
    if not isinstance(x, Tensor):
        raise ValueError("%s: %s must be a Tensor, got %s" % (layer, what, type(x).__name__))
