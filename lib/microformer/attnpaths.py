# microformer.attnpaths: an Attention layer's paths that a plain self-attention step never runs,
# loaded on first use (a board's heap is small): the key padding (key_padding_mask, lengths) and
# its errors, cross-attention's context check, the tiled path (kv_tile), the weights' dropout,
# and the per-item paths (recompute=True; the stored path's backward item by item above
# Attention._back_items). Each function takes the layer as its first argument; attention.py
# binds every name in METHODS to Attention on first use (its stubs are these functions then).
from . import backend
from .layer import shape_error

METHODS = ("_check_context", "_given_mask", "_mask_bytes", "_mask_row", "_lengths_mask", "_length_row",
           "_item", "_new_views", "_mask_item", "_attend_items", "_attend_item", "_attend_back_items",
           "_attend_back_stored", "_attend_back_item", "_weights_item", "_heads", "_attend_tiled",
           "_drop_weights", "_attend_back_tiled", "_attend_back_dropped", "_drop_threshold", "_drop_scale")


def _check_context(self, x, context):
    self._check_x(context, "context")
    if context.shape[0] != x.shape[0]:
        raise shape_error("Attention", "context", "[%d,Sk,%d]" % (x.shape[0], self.embed_dim), context.shape)
    if self.causal and context.shape[1] < x.shape[1]:
        raise ValueError("Attention: causal cross-attention needs Sk >= S, got Sk=%d S=%d"
                         % (context.shape[1], x.shape[1]))


def _given_mask(self, key_padding_mask, lengths, c, buf):
    # Attention._masks with a mask or lengths given: B*Sk bytes (buf filled, or the caller's)
    if lengths is not None:
        if key_padding_mask is not None:
            raise ValueError("Attention: give key_padding_mask or lengths, not both")
        return self._lengths_mask(lengths, c, buf)
    return self._mask_bytes(key_padding_mask, c, buf)


def _mask_bytes(self, mask, c, buf):
    # a key_padding_mask [B,Sk] of the keys c [B,Sk,E] as B*Sk bytes: the caller's, or buf filled
    if isinstance(mask, (bytes, bytearray)):
        if len(mask) != c.shape[0] * c.shape[1]:
            raise _mask_error(c, mask)
        return mask
    if not isinstance(mask, (list, tuple)) or len(mask) != c.shape[0]:
        raise _mask_error(c, mask)
    b = 0
    while b < c.shape[0]:                     # (a `for` would hold its end on the stack: a word more)
        self._mask_row(buf, b, mask[b], c)
        b += 1
    return buf


def _mask_row(self, buf, b, row, c):
    if not isinstance(row, (list, tuple)) or len(row) != c.shape[1]:
        raise _row_error(b, c.shape[1], row)
    j = 0
    b *= c.shape[1]
    while j < c.shape[1]:
        buf[b + j] = 1 if row[j] else 0
        j += 1


def _lengths_mask(self, lengths, c, buf):
    # lengths (B ints) of the keys c [B,Sk,E] as B*Sk bytes in buf (1: key j >= lengths[b])
    if not isinstance(lengths, (list, tuple)) or len(lengths) != c.shape[0]:
        raise _lengths_error(c, lengths, None)
    b = 0
    while b < c.shape[0]:
        self._length_row(buf, b, lengths[b], c)
        b += 1
    return buf


def _length_row(self, buf, b, n, c):
    if not isinstance(n, int) or n < 0 or n > c.shape[1]:
        raise _lengths_error(c, n, b)
    j = 0
    b *= c.shape[1]
    while j < c.shape[1]:
        buf[b + j] = 1 if j >= n else 0
        j += 1


# ---- recompute: the weights of one batch item at a time -----------------------------------------
# The kernels run on item b's rows (B = 1): views on the item's part of each buffer, made once
# per buffer (_item: kept until the buffer is another), so a step allocates nothing for them.

def _item(self, t, b):
    # the view of t's data on batch item b (t [B, *]); a list per buffer, remade when t changes
    c = self._views
    i = 0
    while i < len(c):
        if c[i] is t.data:
            return c[i + 1][b]
        i += 2
    return self._new_views(t)[b]


def _new_views(self, t):
    n = t.size // t.shape[0]
    views = [memoryview(t.data)[k * n:(k + 1) * n] for k in range(t.shape[0])]
    c = self._views
    if len(c) >= 24:                          # the buffers of a few keys: older ones go
        del c[:2]
    c.append(t.data)
    c.append(views)
    return views


def _mask_item(self, b):
    m = self._mask
    if m is None:
        return None
    Sk = self._V.shape[1]
    if self._mview is None or self._mview[0] is not m:
        self._mview = [m] + [memoryview(m)[k * Sk:(k + 1) * Sk] for k in range(self._V.shape[0])]
    return self._mview[b + 1]


def _attend_items(self):
    b = 0
    while b < self._Q.shape[0]:
        self._attend_item(b, self._ctx)
        b += 1


def _attend_item(self, b, ctx):
    # item b: its weights into _A, its context into ctx (a kernel of 12 arguments: a heap frame
    # per item)
    backend.K.attention_forward(self._item(ctx, b), self._A.data, self._item(self._Q, b), self._item(self._Kt, b),
                                self._item(self._V, b), self._mask_item(b), 1, self._Q.shape[1],
                                self._V.shape[1], self.embed_dim, self.num_heads, 1 if self.causal else 0)


def _attend_back_items(self):
    # per item: its weights again (and its context: the same values), then its backward
    b = 0
    while b < self._Q.shape[0]:
        self._attend_item(b, self._ctx)
        self._attend_back_item(b)
        b += 1


def _attend_back_stored(self):
    # the stored weights' backward item by item (Attention._back_items)
    b = 0
    while b < self._Q.shape[0]:
        self._attend_back_item(b)
        b += 1


def _attend_back_item(self, b):
    backend.K.attention_backward(self._item(self._dQ, b), self._item(self._dK, b), self._item(self._dV, b),
                                 self._scratch.data, self._item(self._dctx, b), self._weights_item(b),
                                 self._item(self._Q, b), self._item(self._Kt, b), self._item(self._V, b), 1,
                                 self._Q.shape[1], self._V.shape[1], self.embed_dim, self.num_heads)


def _weights_item(self, b):
    # item b's weights: the one item recompute keeps, or item b's of the stored [B,H,S,Sk]
    return self._A.data if self._A.shape[0] != self._Q.shape[0] else self._item(self._A, b)


# ---- kv_tile: the weights over tiles of keys, never stored -----------------------------------------

def _heads(self):
    # the tiled kernels' sizes: q [B,S,E], k and v [B,Sk,E]
    return (self._Q.shape[0], self._Q.shape[1], self._V.shape[1], self.embed_dim, self.num_heads,
            1 if self.causal else 0, self.kv_tile)


def _attend_tiled(self):
    backend.K.attention_forward_tiled(self._ctx.data, self._stats.data, self._tile.data, self._Q.data,
                                      self._Kt.data, self._V.data, self._mask, self._heads())


def _attend_back_tiled(self):
    backend.K.attention_backward_tiled(self._dQ.data, self._dK.data, self._dV.data, self._tile.data,
                                       self._dctx.data, self._ctx.data, self._stats.data, self._Q.data,
                                       self._Kt.data, self._V.data, self._mask, self._heads())


# ---- dropout on the weights -------------------------------------------------------------------------

def _drop_weights(self):
    # dropout on the weights: ctx = (A * keep / (1-p)) V
    B, H, S, Sk = self._A.shape
    self._drop_rng.keep_mask(self._keep, self._A.size, self._drop_threshold(), backend.K)
    backend.K.attention_context(self._ctx.data, self._A.data, self._keep, self._V.data, B, S, Sk,
                                self.embed_dim, H, self._drop_scale())


def _attend_back_dropped(self):
    backend.K.attention_backward_dropout(self._dQ.data, self._dK.data, self._dV.data, self._scratch.data,
                                         self._dctx.data, self._A.data, self._keep, self._Q.data,
                                         self._Kt.data, self._V.data, self._Q.shape[0], self._Q.shape[1],
                                         self._V.shape[1], self.embed_dim, self.num_heads, self._drop_scale())


def _drop_threshold(self):
    return int(self.dropout * 16777216 + 0.5)     # as Dropout: drop when the top 24 bits are below


def _drop_scale(self):
    return 0.0 if self.dropout >= 1.0 else 1.0 / (1.0 - self.dropout)


# The errors of the mask checks, built here: their messages' arguments would take the checks'
# frames (which run on every masked forward) above 11 words.
def _mask_error(c, mask):
    B, Sk = c.shape[0], c.shape[1]
    if isinstance(mask, (bytes, bytearray)):
        return ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d], got %d bytes" % (B, Sk, len(mask)))
    if not isinstance(mask, (list, tuple)):
        return ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d] (nested lists or %d bytes), got %s"
                          % (B, Sk, B * Sk, type(mask).__name__))
    return ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d] nested lists, got %d rows"
                      % (B, Sk, len(mask)))


def _row_error(b, Sk, row):
    return ValueError("Attention: key_padding_mask row %d must have %d entries, got %r" % (b, Sk, row))


def _lengths_error(c, got, b):
    # b None: the list itself is wrong; else its item b
    if b is None:
        return ValueError("Attention: lengths must be a list of B=%d ints in [0, %d], got %r"
                          % (c.shape[0], c.shape[1], got))
    return ValueError("Attention: lengths[%d] must be an int in [0, %d], got %r" % (b, c.shape[1], got))
