# microformer.dense: fully connected layer, y = x W^T + b (torch.nn.Linear layout).
from . import backend
from .layer import WeightBias, check_tensor, shape_error
from .tensor import Grad, Tensor, default_rng, shape_size, xavier_uniform


class Dense(WeightBias):
    """Dense(in_features, out_features, use_bias=True): x (..., in) -> y (..., out).

    With a LoRA adapter (mf.lora): y = x W^T + b + (alpha/r) (x A^T) B^T (lora.py)."""

    lora = None                  # a LoRA adapter (lora.py), or None
    backward_stops = True

    def __init__(self, in_features, out_features, use_bias=True, rng=None):
        for what, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or v < 1:
                raise ValueError("Dense: %s must be a positive int, got %r" % (what, v))
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.W = xavier_uniform(Tensor((out_features, in_features), name="W"),
                                in_features, out_features, rng or default_rng())   # (OC, C)
        self.dW = Grad((out_features, in_features), "dW")
        self.b = Tensor.zeros((out_features,), "b") if use_bias else None    # (OC,)
        self.db = Grad((out_features,), "db") if use_bias else None
        self._x = None
        self._wkeep = [None]      # a backend's prepared copy of W for one-token calls (decoding)

    def check_input_shape(self, in_shape):
        WeightBias.check_input_shape(self, in_shape)
        if len(in_shape) < 2 or in_shape[-1] != self.in_features:
            raise shape_error("Dense", "input", "[..., %d]" % self.in_features, in_shape)

    def output_shape(self, in_shape):
        return tuple(in_shape[:-1]) + (self.out_features,)

    def cache_floats(self, in_shape):
        n = shape_size(in_shape[:-1])
        return n * (self.out_features + self.in_features)   # y and dx

    def forward(self, x):
        check_tensor("Dense", "x", x)
        C = self.in_features
        if len(x.shape) < 2 or x.shape[-1] != C:
            raise shape_error("Dense", "x", "[N,%d] (or [..., %d])" % (C, C), x.shape)
        self._buffers("_fwd", x.shape)
        self._x = x
        self._product()
        if self.lora is not None:
            self.lora.forward_add(self._y.data, x.data, x.size // C)
        return self._y

    def _product(self):
        # y = x W^T + b for the x of forward(): alone in a method whose only local is self, so
        # its frame (arguments + locals + value stack) stays within the 11 words MicroPython keeps
        # off the GC heap (host/tools/frames.py)
        if self.W.__class__ is not Tensor:
            return self._q8_product()
        backend.K.matmul_forward_kept(self._y.data, self._x.data, self.W.data,
                                      self.b.data if self.use_bias else None, self._x.size // self.in_features,
                                      self.in_features, self.out_features, self._wkeep)

    def keep_weights(self):
        """Let the backend make its kept copy of W for one-token calls now (mf.prefill does, before
        the prompt's buffers, so that a small heap is not left in pieces too small for it): the
        viper backend keeps W's quantized rows and checks them against W on every call. Nothing
        for a backend that keeps none, an int8 weight or a copy already made."""
        make = getattr(backend.K, "keep_weight", None)
        if make is not None and self.W.__class__ is Tensor and self._wkeep[0] is None:
            make(self._wkeep, self.W.data, self.b.data if self.use_bias else None,
                 self.in_features, self.out_features)

    def params(self):
        base = WeightBias.params(self)
        return base if self.lora is None else base + self.lora.params()

    def state_parts(self):
        base = WeightBias.state_parts(self)
        if self.lora is None:
            return base
        return base + self.lora.state_parts()

    def backward(self, dy, grads=True, need_dx=True):
        # a frozen weight or bias has no grad buffer (None): the kernel skips it;
        # need_dx=False: the input gradient is not computed (returns None)
        self._need_forward(self._x)
        check_tensor("Dense", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("Dense", "dy", repr(self._y.shape), dy.shape)
        dx = None
        if need_dx:
            self._buffers("_bwd", self._x.shape)
            dx = self._dx
            self._grad_input(dy)
        grads = grads and self.trainable
        if grads:
            self._grad_weight(dy)
        if self.lora is not None:
            self._lora_backward(dy, dx, grads)
        return dx

    def backward_over_input(self, dy, grads=True):
        """backward(dy, grads) for an input that nothing reads after it (FeedForward's activation
        output computed again for this backward): the weight and adapter grads first, then the
        input gradient written over the input's buffer (no buffer of its own). The same kernels,
        so the same values as backward(); returns the input gradient (the input Tensor)."""
        self._need_forward(self._x)
        check_tensor("Dense", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("Dense", "dy", repr(self._y.shape), dy.shape)
        grads = grads and self.trainable
        if grads:
            self._grad_weight(dy)
        if self.lora is not None:
            self.lora.backward_grads(dy.data, self._x.data, self._x.size // self.in_features, grads)
        self._input_over(dy)
        if self.lora is not None:
            self.lora.input_acc(self._x.data, self._x.size // self.in_features)
        return self._x

    def _input_over(self, dy):
        if self.W.__class__ is not Tensor:
            return self.W.backward(self._x.data, None, None, dy.data, None, dy.size // self.out_features,
                                   self.in_features, self.out_features)
        backend.K.matmul_backward_input(self._x.data, dy.data, self.W.data, dy.size // self.out_features,
                                        self.in_features, self.out_features)

    def _lora_backward(self, dy, dx, train):
        self.lora.backward_add(dy.data, self._x.data, None if dx is None else dx.data,
                               self._x.size // self.in_features, train)

    # the kernel calls of backward, each alone in a method of few locals: their frames stay
    # within the 11 words MicroPython keeps off the GC heap (host/tools/frames.py)
    def _grad_input(self, dy):
        if self.W.__class__ is not Tensor:
            return self._q8_backward(dy, self._dx.data, None)
        backend.K.matmul_backward_input(self._dx.data, dy.data, self.W.data, dy.size // self.out_features,
                                        self.in_features, self.out_features)

    def _grad_weight(self, dy):
        if self.W.__class__ is not Tensor:         # frozen: the bias's gradient only
            return self._q8_backward(dy, None, self.db.data if self.use_bias else None)
        backend.K.matmul_backward_weight(self.dW.data, self.db.data if self.use_bias else None, dy.data,
                                         self._x.data, dy.size // self.out_features, self.in_features,
                                         self.out_features)

    # an int8 weight (quant.py) computes its own products; it never trains (no dW)
    def _q8_product(self):
        self.W.forward(self._y.data, self._x.data, self.b.data if self.use_bias else None,
                       self._x.size // self.in_features, self.in_features, self.out_features)

    def _q8_backward(self, dy, dx, db):
        self.W.backward(dx, None, db, dy.data, self._x.data, dy.size // self.out_features,
                        self.in_features, self.out_features)
