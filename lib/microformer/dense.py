# microformer.dense: fully connected layer, y = x W^T + b (torch.nn.Linear layout).
from . import backend
from .layer import WeightBias, check_tensor, shape_error
from .tensor import Tensor, default_rng, shape_size, xavier_uniform


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
        self.dW = Tensor.zeros((out_features, in_features), "dW")
        self.b = Tensor.zeros((out_features,), "b") if use_bias else None    # (OC,)
        self.db = Tensor.zeros((out_features,), "db") if use_bias else None
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
        N = x.size // C
        self._buffers("_fwd", x.shape)
        y = self._y
        if self.W.__class__ is Tensor:
            backend.K.matmul_forward_kept(y.data, x.data, self.W.data,
                                          self.b.data if self.use_bias else None, N, C, self.out_features,
                                          self._wkeep)
        else:                    # an int8 weight (quant.py)
            self.W.forward(y.data, x.data, self.b.data if self.use_bias else None, N, C,
                           self.out_features)
        if self.lora is not None:
            self.lora.forward_add(y.data, x.data, N)
        self._x = x
        return y

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
        x = self._x
        check_tensor("Dense", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("Dense", "dy", repr(self._y.shape), dy.shape)
        C = self.in_features
        N = x.size // C
        dx = None
        if need_dx:
            self._buffers("_bwd", x.shape)
            dx = self._dx
        train = grads and self.trainable
        db = self.db.data if (train and self.use_bias) else None
        if self.W.__class__ is Tensor:
            backend.K.matmul_backward(dx.data if need_dx else None, self.dW.data if train else None,
                                      db, dy.data, x.data, self.W.data, N, C, self.out_features)
        else:                    # an int8 weight (quant.py): frozen, so no dW
            self.W.backward(dx.data if need_dx else None, None, db, dy.data, x.data, N, C,
                            self.out_features)
        if self.lora is not None:
            self.lora.backward_add(dy.data, x.data, dx.data if need_dx else None, N, train)
        return dx
