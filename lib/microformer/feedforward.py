# microformer.feedforward: the position-wise feed-forward network of a transformer block.
#   y = act(x W1^T + b1) W2^T + b2, applied to every token alike
from . import actkind, backend
from .activation import ActivationLayer
from .dense import Dense
from .dropout import Dropout, check_p
from .layer import Layer, check_tensor, prefixed, shape_error, trains


class FeedForward(Layer):
    """FeedForward(E, hidden, activation='gelu', dropout=0): x [..., E] -> y [..., E]; params W1 b1 W2 b2.

    dropout=p drops the hidden activations in training mode (nn.TransformerEncoderLayer's dropout
    between activation and linear2)."""

    def __init__(self, embed_dim, hidden, activation="gelu", use_bias=True, rng=None, dropout=0.0):
        for what, v in (("embed_dim", embed_dim), ("hidden", hidden)):
            if not isinstance(v, int) or v < 1:
                raise ValueError("FeedForward: %s must be a positive int, got %r" % (what, v))
        check_p("FeedForward", dropout)
        self.embed_dim = embed_dim
        self.hidden = hidden
        self.fc1 = Dense(embed_dim, hidden, use_bias, rng)
        self.act = ActivationLayer(activation)
        self.fc2 = Dense(hidden, embed_dim, use_bias, rng)
        self.kind = activation
        self.drop = Dropout(dropout)
        self.dropout = self.drop.p
        for layer, k in ((self.fc1, "1"), (self.fc2, "2")):
            for p, g in layer.params():
                p.name += k
                g.name += k

    def sublayers(self):
        return (self.fc1, self.act, self.drop, self.fc2)

    def state_parts(self):
        # the linear1 / linear2 of nn.TransformerEncoderLayer
        return prefixed("linear1.", self.fc1) + prefixed("linear2.", self.fc2)

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) < 2 or in_shape[-1] != self.embed_dim:
            raise shape_error("FeedForward", "input", "[..., %d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        h = tuple(in_shape[:-1]) + (self.hidden,)
        # the activation's backward runs in place: its output only; with recompute (inside a block)
        # not even that, unless its backward reads the output (tanh, sigmoid): the output computed
        # again in backward holds the second linear's input gradient (Dense.backward_over_input)
        act = self.act.cache_floats(h) // 2
        if self.recompute and self.act._code != actkind.TANH and self.act._code != actkind.SIGMOID:
            act = 0
        return self.fc1.cache_floats(in_shape) + act + self.drop.cache_floats(h) + self.fc2.cache_floats(h)

    def forward(self, x, dropout=True):
        check_tensor("FeedForward", "x", x)
        E = self.embed_dim
        if len(x.shape) < 2 or x.shape[-1] != E:
            raise shape_error("FeedForward", "x", "[..., %d]" % E, x.shape)
        h = self.act.forward(self.fc1.forward(x))
        h = self.drop.forward(h) if dropout else self.drop.identity(h)    # dropout=False: generation
        return self.fc2.forward(h)

    backward_stops = True
    _in_block = False           # set by an EncoderBlock: its forward is a frame of the scratch arena

    def _get_recompute(self):
        return self.act._out_scratch

    def _set_recompute(self, flag):
        # the activation's forward buffers are made again on the next forward
        if flag is not True and flag is not False:
            raise ValueError("FeedForward: recompute must be True or False, got %r" % (flag,))
        if flag and not self._in_block:
            raise ValueError("FeedForward: recompute needs the scratch arena of an EncoderBlock's forward "
                             "(this FeedForward is not inside one)")
        a = self.act
        a._out_scratch = flag
        a._fwd = None
        if getattr(a, "_stages", None):
            a._stages.pop("_fwd", None)

    # recompute=True (inside an EncoderBlock; a memory choice, not part of the model): the
    # activation's output is a scratch buffer of the block's forward and backward computes it again
    # from its input (the same kernel, the same values): one [..., hidden] buffer less per block,
    # for one more activation pass per backward
    recompute = property(_get_recompute, _set_recompute)

    def _named_sublayers(self):
        return [("linear1.", self.fc1), ("linear2.", self.fc2)]

    def backward(self, dy, grads=True, need_dx=True):
        # need_dx=False: no input gradient (returns None), and none inside that nothing uses
        self._need_forward(self.fc1._x)
        check_tensor("FeedForward", "dy", dy)
        if dy.shape != self.fc2._y.shape:
            raise shape_error("FeedForward", "dy", repr(self.fc2._y.shape), dy.shape)
        grads = grads and self.trainable      # a part's own flag is its own: nothing is changed here
        if self.act._out_scratch or self._fresh:
            self._rerun_act(grads)
        if self._norm is not None and grads and trains(self.fc1):
            self._norm_again()
        if not need_dx and not (grads and trains(self.fc1)):
            self.fc2.backward(dy, grads, False)
            return None
        dy = self._drop_back(self._fc2_back(dy, grads))        # (no new locals: a frame within 11 words)
        return self.fc1.backward(self._act_back(dy), grads, need_dx)

    def _drop_back(self, d):
        # the dropout's backward in place on d, the second linear's input gradient (nothing reads
        # it after this), so no [..., hidden] buffer of its own: the same kernel and mask that
        # Dropout.backward runs, the same values
        dr = self.drop
        dr._need_forward(dr._x)
        if dr._applied:
            backend.K.dropout_apply(d.data, d.data, dr._keep, d.size, dr.scale)
        return d

    def _fc2_back(self, dy, grads):
        # the second linear's backward; over its input when that is the activation's output computed
        # again (_h: nothing reads it after, unless a tanh / sigmoid backward does): no [..., hidden]
        # buffer of its own for the hidden gradient
        if self._hx is not None and self.fc2._x is self._hx and self.act._code != actkind.TANH \
                and self.act._code != actkind.SIGMOID:
            self._hx = None
            return self.fc2.backward_over_input(dy, grads)
        return self.fc2.backward(dy, grads)

    def _act_back(self, d):
        # the activation's backward in place on d, the hidden gradient (fc2's or the dropout's input
        # gradient: nothing reads it after this), so no second [..., hidden] buffer: the same
        # elementwise kernel ActivationLayer.backward runs, the same values (its output: _h when
        # computed again)
        a = self.act
        a._need_forward(a._x)
        backend.K.act_backward(d.data, d.data, a._x.data, self._act_out().data, d.size, a._code)
        return d

    def _act_out(self):
        # the activation's output for its backward (read by tanh and sigmoid only; the others'
        # derivative is a function of the input, and their kernels never read this argument)
        if not self.act._out_scratch:
            return self.act._y
        return self._hx if self._hx is not None else self.act._x

    _hx = None                  # the output computed again by the last backward, or None
    _fresh = False              # the activation's output was made in the running backward's frame

    def _rerun_act(self, grads):
        # inside a block the activation's output is a scratch buffer of the block's forward (the
        # second linear reads it there, layer.Scratch): computed again here from its input (the
        # same kernel, the same values) into _h, which the second linear's backward reads as its
        # input (unless the dropout between them gave it its own), and only when something reads
        # it: the second linear's weight or adapter grads, or a tanh / sigmoid backward
        a = self.act
        a._need_forward(a._x)
        self._hx = None
        if self._fresh:             # a checkpointed block's backward ran the forward in its own frame:
            self._fresh = False     # the output is still there (EncoderBlock.checkpoint)
            self._hx = a._y
            return
        if a._code != actkind.TANH and a._code != actkind.SIGMOID and not (
                grads and self.fc2._x is a._y and trains(self.fc2)):
            return
        self._buffers("_bwd", a._x.shape)
        backend.K.act_forward(self._h.data, a._x.data, self._h.size, a._code)
        self._hx = self._h
        if self.fc2._x is a._y:
            self.fc2._x = self._h

    _norm = None    # a pre-norm EncoderBlock's LayerNorm2, whose output (this FFN's input) is not kept

    def _norm_again(self):
        # the input computed again by the LayerNorm before this FFN (a pre-norm block wrote it into
        # a buffer that its residual sum overwrote) into a scratch buffer, for the first linear's
        # weight and adapter grads (the same kernel and input: the same values)
        self._buffers("_in", self.fc1._x.shape)
        self.fc1._x = self._norm.output_again(self._xin)

    def _allocate(self, stage, shape, other, bufs):
        # '_bwd': the activation's output computed again (_rerun_act), [..., hidden]; '_in': the
        # input computed again (_norm_again), [..., E]
        if stage == "_in":
            self._xin = bufs.scratch("_xin", shape)
            return
        self._h = bufs.scratch("_h", shape)
