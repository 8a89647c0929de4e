# microformer.attention: multi-head scaled dot-product attention (the seed's Attention layer).
#   Q = x Wq^T + bq, K = c Wk^T + bk, V = c Wv^T + bv      (c = context, or x itself)
#   A_h = softmax(Q_h K_h^T / sqrt(D) + mask), ctx_h = A_h V_h, y = concat_h(ctx_h) Wo^T + bo
from . import backend
from .layer import Layer, check_tensor, shape_error
from .lazy import adopt, sibling, stub
from .tensor import Grad, Rng, Tensor, default_rng, dropout_seed, xavier_uniform


class _Proj:
    """One projection of an Attention layer (q, k, v or o): out = inp . W^T + b, plus its LoRA
    adapter's share. W, b, their grads and the adapter are read from the layer by name on every
    call (quant.py and lora.py replace them there). The operands are kept as attributes, so that
    each kernel call is made from a method whose frame is self alone: a method passing a kernel's
    6 to 8 arguments next to arguments of its own would need more than the 11 words MicroPython
    keeps off the GC heap, and would take its frame from the heap on every call."""

    def __init__(self, layer, names, keep):
        self.layer = layer
        self.w, self.b, self.dw, self.db, self.ad = names   # literal names: getattr allocates nothing
        self.keep = keep                # the backend's kept copy of W for decoding: a list [None]
        self.E = layer.embed_dim
        self.out = self.inp = self.dout = self.dinp = None
        self.acc = False

    def forward(self, out, inp):
        # out (N, E) = inp (N, E) . W^T + b (+ the adapter's), N = the rows of out
        self.out = out
        self.inp = inp
        self._product()
        if getattr(self.layer, self.ad) is not None:
            getattr(self.layer, self.ad).forward_add(out.data, inp.data, out.size // self.E)

    def forward_kept(self, out, inp):
        # forward() of one token per sequence (decoding) through the backend's kept copy of W
        # (decoding refuses adapters: Attention._no_lora)
        self.out = out
        self.inp = inp
        if getattr(self.layer, self.w).__class__ is not Tensor:
            self._product()
        else:
            self._kept()

    def _product(self):
        if getattr(self.layer, self.w).__class__ is not Tensor:        # an int8 weight (quant.py)
            getattr(self.layer, self.w).forward(self.out.data, self.inp.data, self._bias(),
                                                self.out.size // self.E, self.E, self.E)
        else:
            backend.K.matmul_forward(self.out.data, self.inp.data, getattr(self.layer, self.w).data,
                                     self._bias(), self.out.size // self.E, self.E, self.E)

    def _kept(self):
        backend.K.matmul_forward_kept(self.out.data, self.inp.data, getattr(self.layer, self.w).data,
                                      self._bias(), self.out.size // self.E, self.E, self.E, self.keep)

    def _bias(self):
        b = getattr(self.layer, self.b)
        return None if b is None else b.data

    def backward(self, dout, inp, dinp, acc):
        # in the forward pass this was out = inp . W^T + b: dW += dout^T inp, db += sum dout (when
        # the layer trains: layer._train), dinp = dout . W (acc: +=; dinp None: not computed),
        # and the adapter's share of each
        self.dout = dout
        self.inp = inp
        self.dinp = dinp
        self.acc = acc
        if getattr(self.layer, self.w).__class__ is not Tensor:
            self._back_q8()
        else:
            self._back()
        if getattr(self.layer, self.ad) is not None:
            self._adapter_back()

    def _back(self):
        if self.layer._train:
            backend.K.matmul_backward_weight(getattr(self.layer, self.dw).data, self._dbias(), self.dout.data,
                                             self.inp.data, self.dout.size // self.E, self.E, self.E)
        if self.dinp is None:
            return
        if self.acc:
            backend.K.matmul_backward_input_acc(self.dinp.data, self.dout.data, getattr(self.layer, self.w).data,
                                                self.dout.size // self.E, self.E, self.E)
        else:
            backend.K.matmul_backward_input(self.dinp.data, self.dout.data, getattr(self.layer, self.w).data,
                                            self.dout.size // self.E, self.E, self.E)

    def _back_q8(self):
        # an int8 weight (quant.py): it refuses weight grads (it never trains); its bias may train
        if not self.acc:
            getattr(self.layer, self.w).backward(self._data(self.dinp), self._dweight(), self._dbias(),
                                                 self.dout.data, self.inp.data, self.dout.size // self.E,
                                                 self.E, self.E)
            return
        if self.layer._train:
            getattr(self.layer, self.w).backward(None, self._dweight(), self._dbias(), self.dout.data,
                                                 self.inp.data, self.dout.size // self.E, self.E, self.E)
        if self.dinp is not None:
            getattr(self.layer, self.w).backward_input_acc(self.dinp.data, self.dout.data,
                                                           self.dout.size // self.E, self.E, self.E)

    def _adapter_back(self):
        getattr(self.layer, self.ad).backward_add(self.dout.data, self.inp.data, self._data(self.dinp),
                                                  self.dout.size // self.E, self.layer._train)

    def _dweight(self):
        return getattr(self.layer, self.dw).data if self.layer._train else None

    def _dbias(self):
        db = getattr(self.layer, self.db)
        return None if db is None or not self.layer._train else db.data

    def _data(self, t):
        return None if t is None else t.data


_NAMES = (("Wq", "bq", "dWq", "dbq", "lora_q"), ("Wk", "bk", "dWk", "dbk", "lora_k"),
          ("Wv", "bv", "dWv", "dbv", "lora_v"), ("Wo", "bo", "dWo", "dbo", "lora_o"))


def _paths():
    # attnpaths, imported now if it is not yet; its functions become Attention's methods
    m = sibling("attnpaths", "Attention")
    return adopt(Attention, m, m.METHODS)


class Attention(Layer):
    """Attention(embed_dim, num_heads, use_bias=True, causal=False): x [B,S,E] -> y [B,S,E].

    forward(x, key_padding_mask=None, context=None, lengths=None):
      key_padding_mask [B,Sk] (nested lists or a flat bytes-like, nonzero = padded key);
      lengths: B ints, keys j >= lengths[b] are padding (the tail-padding shortcut);
      context [B,Sk,E] gives cross-attention (K and V from context).
    A masked weight is exactly 0; a query whose keys are all masked gets weights 0, context 0
    (so its output is bo) and no gradient. weights(b, h) / stages(): the last forward's weights,
    until a backward runs (the viper backward of a large item writes their gradient over them).

    KV cache (causal self-attention): y = prefill(x [B,S,E]) then y_t = decode_step(x_t [B,1,E])
    per new token; capacity max_len (here or in prefill). kv_bytes_per_token() = 8 * E.

    dropout=p: in training mode the softmax weights are dropped with probability p and the kept
    ones scaled by 1/(1-p) before they weight V (torch.nn.MultiheadAttention's dropout); eval()
    turns it off. kv_tile=T: the weights are computed over tiles of T keys with an online softmax
    and never stored (no [B,H,S,Sk] buffer: memory O(B S E) instead of O(B H S Sk)); backward
    recomputes them from the per-row max and sum. Same results as the standard path within
    float32 rounding (README: Tolerances); weights() / stages() are then not available, and
    dropout > 0 needs the stored weights (kv_tile=None).
    """

    lora_q = lora_k = lora_v = lora_o = None    # LoRA adapters on the projections (lora.py)
    backward_stops = True
    _recompute = False
    _prompted = False          # prefill has put a prompt in the KV cache (decode_step may run)
    _spent = False             # a backward has run since the forward: the weights buffer holds dS
    _shared = False            # the forward ran in a checkpointed block (EncoderBlock.checkpoint)

    def _get_recompute(self):
        return self._recompute

    def _set_recompute(self, flag):
        # the forward's buffers are made again on the next forward (the weights' size changes)
        if flag is not True and flag is not False:
            raise ValueError("Attention: recompute must be True or False, got %r" % (flag,))
        self._recompute = flag
        self._fwd = None
        if getattr(self, "_stages", None):
            self._stages.pop("_fwd", None)

    # recompute=True (a memory choice, not part of the model: specs and checkpoints do not carry
    # it): the weights [B,H,S,Sk] are kept for one batch item at a time and backward computes each
    # item's again with the same kernel (the same values: outputs and gradients bit for bit those
    # of the stored path), for one more pass of scores, softmax and context per backward. Standard
    # path (kv_tile=None) without dropout, batches of 2 or more; weights() and stages() need the
    # stored weights
    recompute = property(_get_recompute, _set_recompute)

    def __init__(self, embed_dim, num_heads, use_bias=True, causal=False, rng=None, max_len=None,
                 dropout=0.0, kv_tile=None):
        if not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError("Attention: embed_dim must be a positive int, got %r" % (embed_dim,))
        if not isinstance(num_heads, int) or num_heads < 1 or embed_dim % num_heads:
            raise ValueError("Attention: embed_dim %d must be divisible by num_heads, got num_heads=%r"
                             % (embed_dim, num_heads))
        E = embed_dim
        self.embed_dim = E
        self.num_heads = num_heads
        self.head_dim = E // num_heads
        self.use_bias = use_bias
        self.causal = bool(causal)
        if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
            raise ValueError("Attention: max_len must be a positive int or None, got %r" % (max_len,))
        self.max_len = max_len
        self._pos = 0
        self._kc = None
        self._wkeep = ([None], [None], [None], [None])  # decode_step: prepared Wq Wk Wv Wo (backend's)
        rng = rng or default_rng()
        for n in ("q", "k", "v", "o"):
            setattr(self, "W" + n, xavier_uniform(Tensor((E, E), name="W" + n), E, E, rng))  # (E, E)
            setattr(self, "dW" + n, Grad((E, E), "dW" + n))
            if use_bias:
                setattr(self, "b" + n, Tensor.zeros((E,), "b" + n))                       # (E,)
                setattr(self, "db" + n, Grad((E,), "db" + n))
            else:
                setattr(self, "b" + n, None)
                setattr(self, "db" + n, None)
        self._x = None
        # no dropout (the float 0.0, the default): dropout.py, which checks any other value, stays unloaded
        self.dropout = 0.0 if dropout.__class__ is float and dropout == 0.0 else \
            sibling("dropout", "Attention").check_p("Attention", dropout)
        if kv_tile is not None and (isinstance(kv_tile, bool) or not isinstance(kv_tile, int) or kv_tile < 1):
            raise ValueError("Attention: kv_tile must be a positive int (keys per tile) or None, got %r"
                             % (kv_tile,))
        if kv_tile is not None and self.dropout > 0.0:
            raise ValueError("Attention: dropout=%r needs the stored attention weights, which kv_tile=%d "
                             "never keeps: use dropout=0 with kv_tile" % (dropout, kv_tile))
        self.kv_tile = kv_tile
        # the attention-weight dropout's generator: from the dropout stream (mf.seed resets it),
        # not from the weights' generator, so the weights do not depend on p
        self._drop_rng = Rng(dropout_seed()) if self.dropout > 0.0 else None
        self._dropped = False
        self._train = False
        self._views = []          # recompute: [buffer data, its items' views, ...] (_item)
        self._mview = None
        self._pq, self._pk, self._pv, self._po = [_Proj(self, _NAMES[i], self._wkeep[i]) for i in range(4)]

    def params(self):
        out = []
        for n in ("q", "k", "v", "o"):
            out.append((getattr(self, "W" + n), getattr(self, "dW" + n)))
            if self.use_bias:
                out.append((getattr(self, "b" + n), getattr(self, "db" + n)))
        for n in ("q", "k", "v", "o"):
            a = getattr(self, "lora_" + n)
            if a is not None:
                out.extend(a.params())
        return out

    def _adapted(self):
        return (self.lora_q is not None or self.lora_k is not None or self.lora_v is not None
                or self.lora_o is not None)

    def _no_lora(self, what):
        if self._adapted():
            raise ValueError("Attention: %s runs on the base weights only: merge the LoRA adapters "
                             "first (mf.merge_lora(model))" % what)

    def state_parts(self):
        # nn.MultiheadAttention(E, H, batch_first=True): in_proj = [Wq; Wk; Wv] [3E, E]
        out = [("in_proj_weight", [self.Wq, self.Wk, self.Wv])]
        if self.use_bias:
            out.append(("in_proj_bias", [self.bq, self.bk, self.bv]))
        out.append(("out_proj.weight", [self.Wo]))
        if self.use_bias:
            out.append(("out_proj.bias", [self.bo]))
        for n, name in (("q", "q_proj."), ("k", "k_proj."), ("v", "v_proj."), ("o", "out_proj.")):
            a = getattr(self, "lora_" + n)
            if a is not None:
                for k, t in a.state_parts():
                    out.append((name + k, t))
        return out

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("Attention", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        H = self.num_heads
        if self.kv_tile is not None:
            # Q K V ctx y and their grads (dctx dQ dK dV; dx is written into dctx), the row
            # stats [B,H,S,2] and one tile
            return 9 * B * S * E + 2 * B * H * S + self.kv_tile
        # Q K V ctx y and their grads (dctx dQ dK dV; dx in dctx), plus A [B,H,S,S] (and its byte mask)
        drop = (B * H * S * S + 3) // 4 if self.dropout > 0.0 else 0
        return 9 * B * S * E + (1 if self._per_item(B) else B) * H * S * S + S + drop

    def _check_x(self, x, what):
        check_tensor("Attention", what, x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("Attention", what, "[B,S,%d]" % E, x.shape)

    # forward, backward and the decoding steps are split so that each method's frame (arguments +
    # locals + value stack) stays within 11 words: a larger one comes from the GC heap on every
    # call on MicroPython. The attention kernels' own calls (10 to 17 arguments) cannot: each is
    # alone in its method (_attend, _attend_back, _decode_attend, ...), one heap frame per call.
    def forward(self, x, key_padding_mask=None, context=None, lengths=None):
        c = self._inputs(x, context)                  # the context, or x itself; the buffers
        self._mask = self._key_mask(key_padding_mask, lengths, c)
        self._qkv(x, c)
        self._attend()
        self._po.forward(self._y, self._ctx)
        self._x = x
        self._c = context
        return self._y

    def _inputs(self, x, context):
        # x [B,S,E] and the context [B,Sk,E] checked; the buffers follow x's shape and, for
        # cross-attention, the context's
        self._check_x(x, "x")
        if context is None:
            self._buffers("_fwd", x.shape, None)
            return x
        self._check_context(x, context)
        self._buffers("_fwd", x.shape, context.shape)
        return context

    def _key_mask(self, key_padding_mask, lengths, c):
        return self._masks(key_padding_mask, lengths, c, self._mbuf)

    def _masks(self, key_padding_mask, lengths, c, buf):
        # the padding of the keys c [B,Sk,E] as B*Sk bytes (nonzero = padded; buf filled, or the
        # caller's bytes), or None (a given mask or lengths: attnpaths._given_mask)
        if key_padding_mask is None and lengths is None:
            return None
        return self._given_mask(key_padding_mask, lengths, c, buf)

    def _qkv(self, x, c):
        self._project_qkv(self._Q, self._Kt, self._V, x, c)

    def _attend(self):
        # per head: A = softmax(Q K^T / sqrt(D) + mask), ctx = A V (a kernel of 12 arguments: this
        # frame comes from the heap, one per forward); then the weights' dropout
        if self.kv_tile is not None:
            self._attend_tiled()
        elif self._A.shape[0] != self._Q.shape[0]:
            self._attend_items()
        else:
            backend.K.attention_forward(self._ctx.data, self._A.data, self._Q.data, self._Kt.data, self._V.data,
                                        self._mask, self._Q.shape[0], self._Q.shape[1], self._V.shape[1],
                                        self.embed_dim, self.num_heads, 1 if self.causal else 0)
        self._spent = False
        self._dropped = self.training and self.dropout > 0.0
        if self._dropped:
            self._drop_weights()

    def _per_item(self, B):
        return self._recompute and B > 1 and self.dropout == 0.0

    def _rebuffer(self, stage, shape, other):
        # another key: the items' views (on the buffers of the key in use) are made again when
        # used, so that none keeps a replaced array alive
        self._views = []
        self._mview = None
        Layer._rebuffer(self, stage, shape, other)

    # The stored path's backward also runs item by item when the batch's [B,H,S,Sk] weights hold
    # more than _back_items floats: the kernels' own temporaries (on viper the dA / dS block; for an
    # item of more than viper_softmax.PIECE weights a piece of rows, dS written over the item's
    # weights) are then one item's; each item's gradients are those of the whole batch's call, bit for bit
    # (tests/mp/test_ffn_keep.py). Below it one call over the batch: a kernel call per item costs
    # more than the small block saves (Iris, [16,2,4,4]: 21 % more instructions per training
    # sample item by item, 32-bit port). None: always one call.
    _back_items = 4096

    def _allocate(self, stage, shape, other, bufs):
        B, S, E = shape
        H = self.num_heads
        if stage == "_fwd" or stage == "_bwd":
            Sk = S if other is None else other[1]
            if stage == "_fwd":
                self._Q = bufs.zeros("_Q", (B, S, E))
                self._Kt = bufs.zeros("_Kt", (B, Sk, E))   # the keys (K names the kernels)
                self._V = bufs.zeros("_V", (B, Sk, E))
                self._ctx = bufs.zeros("_ctx", (B, S, E))
                if self.kv_tile is None:
                    # per item (recompute): the weights of one item; the items' views on Q K V ctx
                    self._A = bufs.zeros("_A", (1 if self._per_item(B) else B, H, S, Sk))
                    if self.dropout > 0.0:
                        self._keep = bufs.bytes("_keep", B * H * S * Sk)
                    else:
                        self._keep = bufs.none("_keep")
                else:                                     # tiled: row max and sum, one tile of scores
                    self._A = bufs.none("_A")
                    self._stats = bufs.zeros("_stats", (B, H, S, 2))
                    self._tile = bufs.zeros("_tile", (min(self.kv_tile, Sk),))
                if self._out_scratch:                     # read by a block's residual add only
                    self._y = bufs.scratch("_y", (B, S, E))
                else:
                    self._y = bufs.zeros("_y", (B, S, E))
                self._mbuf = bufs.bytes("_mbuf", B * Sk)  # a key_padding_mask / lengths as bytes
            else:
                # in a block's backward these are the arena's (Scratch): read by nothing after it
                # dx is written into dctx once the heads' backward has read it (backward)
                self._dctx = bufs.scratch("_dctx", (B, S, E))
                self._dQ = bufs.scratch("_dQ", (B, S, E))
                self._dK = bufs.scratch("_dK", (B, Sk, E))
                self._dV = bufs.scratch("_dV", (B, Sk, E))
                self._scratch = bufs.scratch("_scratch", (Sk,))
                if other is None:
                    self._dcontext = bufs.none("_dcontext")
                else:
                    self._dcontext = bufs.zeros("_dcontext", other)
        else:                                             # decoding and cached stages
            _decoding().allocate(self, stage, shape, other, bufs)

    def backward(self, dy, grads=True, need_dx=True):
        # a frozen projection has no grad buffers (None): the kernels skip them; need_dx=False
        # (self-attention only): the input gradient is not computed (returns None). Returns dx;
        # cross-attention keeps the context's gradient in self.dcontext (else None)
        self._check_dy(dy)
        self._train = grads and self.trainable
        self._buffers("_bwd", self._x.shape, None if self._c is None else self._c.shape)
        self._dx = self._dctx                     # (B, S, E): free once _attend_back has read dctx
        # output projection: dWo += dy^T ctx, dctx = dy Wo
        self._po.backward(dy, self._ctx, self._dctx, False)
        # per head: dV = A^T dctx, dA = dctx V^T, dS = A (dA - rowsum(dA A)) / sqrt(D), dQ = dS K, dK = dS^T Q
        # (the viper kernel writes dS over the weights: weights() and stages() refuse until a
        # forward, and a second backward of one forward computes them again first)
        if self._spent:
            self._weights_again()
        self._spent = True
        self._attend_back()
        # input projections: dW += dProj^T x, dx (+)= dProj W
        if not need_dx and self._c is None:       # nothing below needs dx: weight grads only
            self._pq.backward(self._dQ, self._x, None, False)
            self._pk.backward(self._dK, self._x, None, False)
            self._pv.backward(self._dV, self._x, None, False)
            return None
        self._pq.backward(self._dQ, self._x, self._dx, False)
        self._kv_back()
        return self._dx

    def _check_dy(self, dy):
        self._need_forward(self._x)
        self.dcontext = None
        check_tensor("Attention", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("Attention", "dy", "[%d,%d,%d]" % self._x.shape, dy.shape)

    def _attend_back(self):
        # the heads' backward (a kernel of 15 arguments or more: this frame comes from the heap, one
        # per backward); the weights recomputed from the row max and sum when tiled; A' = A *
        # keep / (1-p) weighting V when dropped
        if self.kv_tile is not None:
            self._attend_back_tiled()
        elif self._A.shape[0] != self._Q.shape[0]:
            self._attend_back_items()
        elif self._dropped:
            self._attend_back_dropped()
        elif self._back_items is not None and self._Q.shape[0] > 1 and self._A.size > self._back_items:
            self._attend_back_stored()
        else:
            backend.K.attention_backward(self._dQ.data, self._dK.data, self._dV.data, self._scratch.data,
                                         self._dctx.data, self._A.data, self._Q.data, self._Kt.data, self._V.data,
                                         self._Q.shape[0], self._Q.shape[1], self._V.shape[1], self.embed_dim,
                                         self.num_heads)

    def _weights_again(self):
        # the stored weights of the last forward, computed again (the same kernel on the same Q K V:
        # the same values; ctx is written with its own values); dropped or per-item weights are
        # not written over by a backward, tiled ones are never stored
        if self.kv_tile is None and not self._dropped and self._A.shape[0] == self._Q.shape[0]:
            backend.K.attention_forward(self._ctx.data, self._A.data, self._Q.data, self._Kt.data, self._V.data,
                                        self._mask, self._Q.shape[0], self._Q.shape[1], self._V.shape[1],
                                        self.embed_dim, self.num_heads, 1 if self.causal else 0)

    def _kv_back(self):
        # K and V: their weight grads, then their input grads added into dx (or the context's)
        c = self._x
        dc = self._dx
        if self._c is not None:
            c = self._c
            dc = self._dcontext
            backend.K.zero(dc.data, dc.size)
        self._pk.backward(self._dK, c, dc, True)
        self._pv.backward(self._dV, c, dc, True)
        if self._c is not None:
            self.dcontext = dc

    # ---- the paths attnpaths.py holds (loaded on first use: a plain self-attention step never
    # runs them; its functions replace these stubs on the class then): a given key padding (mask
    # or lengths), cross-attention's context check, kv_tile, the weights' dropout, per-item
    # weights (recompute) and the stored weights' backward item by item
    _check_context = stub(_paths, "_check_context")
    _given_mask = stub(_paths, "_given_mask")
    _attend_tiled = stub(_paths, "_attend_tiled")
    _attend_items = stub(_paths, "_attend_items")
    _drop_weights = stub(_paths, "_drop_weights")
    _attend_back_tiled = stub(_paths, "_attend_back_tiled")
    _attend_back_items = stub(_paths, "_attend_back_items")
    _attend_back_dropped = stub(_paths, "_attend_back_dropped")
    _attend_back_stored = stub(_paths, "_attend_back_stored")

    # ------------------------------------------------------------ KV cache (generation)

    def kv_bytes_per_token(self):
        """Bytes the cache holds per token per sequence: K and V rows, float32."""
        return 2 * 4 * self.embed_dim

    def kv_cache_bytes(self):
        """Bytes the allocated cache holds (0 before prefill)."""
        return 0 if self._kc is None else 2 * 4 * self._kc.size

    def _check_decoding(self, what):
        if not self.causal:
            raise ValueError("Attention: %s needs causal=True self-attention (this layer has causal=False)"
                             % what)

    def _project_qkv(self, q, k, v, x, c):
        # q (Nq, E) = x . Wq^T + bq; k, v (Nk, E) = c . Wk^T + bk, c . Wv^T + bv (c = x: self-attention)
        self._pq.forward(q, x)
        self._pk.forward(k, c)
        self._pv.forward(v, c)

    # ---- generation and inspection: attndecode.py, loaded on first use; its functions replace
    # these stubs on the class then (a training program never loads it)

    def weights(self, b=0, h=0):
        """The last forward's attention weights of batch item b, head h: [S][Sk] lists."""
        return _decoding().weights(self, b, h)

    def stages(self):
        """The last forward's intermediates as Tensors [B,H,S,Sk]: scores before scaling, after
        scaling, after masking (-inf where hidden), softmax weights; plus Q K V ctx [B,*,E]."""
        return _decoding().stages(self)

    def keep_weights(self):
        """The backend's kept copies of Wq Wk Wv Wo for decode_step, made now (as Dense.keep_weights;
        none while LoRA adapters are attached: decoding refuses them)."""
        return _decoding().keep_weights(self)

    def prefill(self, x, max_len=None):
        """Causal forward over the prompt x [B,S,E]; keeps its K and V in a cache of max_len tokens."""
        return _decoding().prefill(self, x, max_len)

    def reserve_cache(self, B, S, max_len=None):
        """Make the KV cache of B sequences (capacity max_len, or the layer's) and what a decoding
        step keeps, now, for a prompt of S tokens (attndecode.reserve_cache)."""
        return _decoding().reserve_cache(self, B, S, max_len)

    def decode_step(self, x):
        """One new token per sequence, x [B,1,E] -> y [B,1,E], attending to every cached token."""
        return _decoding().decode_step(self, x)

    def cache_context(self, context, key_padding_mask=None, lengths=None):
        """K and V of context [B,Sk,E] computed once for cross_step(); its padding (mask or lengths)."""
        return _decoding().cache_context(self, context, key_padding_mask, lengths)

    def cross_step(self, x):
        """Queries x [B,T,E] -> y [B,T,E] attending to the context cached by cache_context()."""
        return _decoding().cross_step(self, x)

    def prefill_padded(self, x, lengths=None, key_padding_mask=None, max_len=None):
        """prefill() for prompts of different lengths: x [B,S,E] padded, lengths B ints (or a
        key_padding_mask [B,S]); padded slots stay hidden from every later token."""
        return _decoding().prefill_padded(self, x, lengths, key_padding_mask, max_len)

    def decode_step_padded(self, x):
        """decode_step() after prefill_padded(): the new token sees its own prompt's keys only."""
        return _decoding().decode_step_padded(self, x)


def _decoding():
    # attndecode, imported now if it is not yet; its public functions become Attention's methods
    m = sibling("attndecode", "Attention")
    for name in m.PUBLIC:
        setattr(Attention, name, getattr(m, name))
    return m
