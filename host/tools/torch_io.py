"""PyTorch in and out: torch modules <-> microformer models, and torch files <-> checkpoints.

    from torch_io import from_torch, to_torch, load_into
    model = from_torch(torch_module)       # microformer model with the same weights
    module = to_torch(model)               # a torch module computing what the model computes
    load_into(my_module, "tuned.mfck")     # a checkpoint's weights back into YOUR torch module

    python host/tools/torch_io.py model.pt --model mymodel.py:build --out model.mfck --meta meta.json
        model.pt: torch.save(module.state_dict(), 'model.pt'); mymodel.py:build: your Python file
        and the function in it that builds the module (that file is imported and runs: it is
        yours). Writes a checkpoint carrying its spec (mf.load_model rebuilds it on the board) and
        the metadata, checked with microformer.meta.check (defaults are printed, errors refused).
    python host/tools/torch_io.py tuned.mfck --model mymodel.py:build --out tuned.pt
        the reverse: a state_dict in your module's layout (torch.load(..., weights_only=True)).
    Nothing from a .pt runs: it is read with torch.load(weights_only=True). A whole pickled module
    (torch.save(module)) needs --trust, which runs code from the file.

A module with a forward of its own (anything but an nn.Sequential or a torch.nn module) is converted
by capturing its forward with torch.fx (torch_fx.py: residuals, transposes, means, x[:, 0], a learned
token, ...); the converted model keeps the module's state_dict names.
Supported in an nn.Sequential: nn.Linear, nn.ReLU / GELU (both forms) / Tanh / Sigmoid / LeakyReLU(0.01), nn.Dropout,
nn.MultiheadAttention (batch_first=True; its dropout), nn.LayerNorm, nn.Embedding,
nn.TransformerEncoderLayer (batch_first=True; pre-norm or post-norm) / nn.TransformerDecoderLayer
(norm_first=True, batch_first=True), nn.Sequential,
nn.Unflatten(1, ...), and this file's SelfAttention, Reshape, GlobalAvgPool, PositionalEncoding,
FeedForward, LearnedPositionalEmbedding modules.
Channels first, as torch users write sensor models: nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d and
nn.AdaptiveAvgPool1d(1) on [B, C, L] (the model's input or another of them), then nn.Flatten and
an nn.Linear. microformer's layers take [B, L, C] (channels last), and so does the converted model:
the Conv1d weights are the same, and the Linear after the Flatten gets its input columns reordered
from torch's c*L + l to microformer's l*C + c (load_into reorders them back). This file's
ChannelsLastConv1d / ChannelsLastMaxPool1d / ChannelsLastAvgPool1d are those torch modules on
[B, L, C] (what to_torch returns for Conv1D / pools). Anything else is named in the error, with its
place in the module tree.
Dropout probabilities cross over both ways (nn.Dropout <-> mf.Dropout, MultiheadAttention's
dropout <-> Attention(dropout=p), TransformerEncoderLayer's dropout <-> EncoderBlock(dropout=p),
TransformerDecoderLayer's dropout <-> DecoderBlock(dropout=p); a layer whose dropouts differ is refused);
this file's Seq2SeqTransformer (nn.Transformer with embeddings, positional encodings and output
projection) <-> microformer.Transformer, state_dict names equal;
the masks are drawn by each side's own generator, so only eval-mode outputs can be equal.
ignore_dropout=True converts every dropout as p = 0. torch is needed on the host only; the board
never imports it.
"""
import argparse
import importlib.util
import json
import math
import os
import pickle
import re
import sys
import warnings

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "lib"))
import microformer as mf  # noqa: E402
from microformer import checkpoint  # noqa: E402
from microformer import meta as session_meta  # noqa: E402
from microformer.checkpoint import load_model  # noqa: E402
from microformer.spec import difference, to_spec  # noqa: E402


# ---- torch modules for the microformer layers torch has no module for -------------------

class GlobalAvgPool(nn.Module):
    """[B,S,E] -> [B,E], the mean over S (microformer.GlobalAvgPool)."""

    def forward(self, x):
        return x.mean(dim=1)


class PositionalEncoding(nn.Module):
    """x [B,S,E] + the sinusoidal table of the seeds (microformer.PositionalEncoding)."""

    def __init__(self, max_len, embed_dim, dropout=0.0):
        super().__init__()
        self.max_len, self.embed_dim = max_len, embed_dim
        self.dropout = nn.Dropout(dropout)
        pe = torch.zeros(max_len, embed_dim)
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        div = torch.exp(torch.arange(0, embed_dim, 2, dtype=torch.float64) * (-math.log(10000.0) / embed_dim))
        pe[:, 0::2] = torch.sin(pos * div).float()
        pe[:, 1::2] = torch.cos(pos * div).float()[:, :embed_dim // 2]
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x):
        return self.dropout(x + self.pe[:x.shape[1]])


class Seq2SeqTransformer(nn.Transformer):
    """microformer.Transformer in torch: nn.Transformer(norm_first=True, batch_first=True) plus the
    token embeddings, the sinusoidal positional encodings and the output projection. Its
    state_dict names are microformer's: nn.Transformer's own (encoder.layers.i.*, encoder.norm.*,
    decoder.layers.i.*, decoder.norm.*) and src_embed.weight, tgt_embed.weight, generator.*.
    forward(src [B,Ss] ids, tgt [B,St] ids, src_lengths=None, tgt_lengths=None) -> logits [B,St,V]
    with the masks microformer builds from the lengths (tail padding; the decoder is causal)."""

    def __init__(self, src_vocab, tgt_vocab, embed_dim, num_heads, ffn_hidden, num_encoder_layers=1,
                 num_decoder_layers=1, max_len=64, activation="gelu", bias=True, dropout=0.0):
        act = {"relu": "relu", "gelu": "gelu"}.get(activation) or _torch_activation(activation)
        with warnings.catch_warnings():     # norm_first=True: torch says it keeps nested tensors off
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            super().__init__(embed_dim, num_heads, num_encoder_layers, num_decoder_layers, ffn_hidden,
                             dropout=dropout, activation=act, batch_first=True, norm_first=True, bias=bias)
        self.activation_name = activation
        self.max_len = max_len
        self.src_embed = nn.Embedding(src_vocab, embed_dim)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed_dim)
        self.src_pos = PositionalEncoding(max_len, embed_dim, dropout)
        self.tgt_pos = PositionalEncoding(max_len, embed_dim, dropout)
        self.generator = nn.Linear(embed_dim, tgt_vocab, bias=bias)

    @staticmethod
    def _padding(lengths, B, S):
        if lengths is None:
            return None
        return torch.arange(S)[None, :] >= torch.as_tensor(lengths).reshape(B, 1)

    def forward(self, src, tgt, src_lengths=None, tgt_lengths=None):
        B, Ss = src.shape
        St = tgt.shape[1]
        smask = self._padding(src_lengths, B, Ss)
        causal = torch.ones(St, St, dtype=torch.bool).triu(1)
        h = super().forward(self.src_pos(self.src_embed(src)), self.tgt_pos(self.tgt_embed(tgt)),
                            tgt_mask=causal, src_key_padding_mask=smask,
                            tgt_key_padding_mask=self._padding(tgt_lengths, B, St),
                            memory_key_padding_mask=smask, tgt_is_causal=True)
        return self.generator(h)


class FeedForward(nn.Module):
    """linear1 -> activation -> dropout -> linear2 (microformer.FeedForward; names as in
    TransformerEncoderLayer)."""

    def __init__(self, embed_dim, hidden, activation="gelu", bias=True, dropout=0.0):
        super().__init__()
        self.activation_name = activation
        self.linear1 = nn.Linear(embed_dim, hidden, bias=bias)
        self.act = _torch_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(hidden, embed_dim, bias=bias)

    def forward(self, x):
        return self.linear2(self.dropout(self.act(self.linear1(x))))


class ChannelsLastConv1d(nn.Conv1d):
    """nn.Conv1d on [B, L, C] (microformer.Conv1D): same parameters and state_dict names."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class ChannelsLastMaxPool1d(nn.MaxPool1d):
    """nn.MaxPool1d on [B, L, C] (microformer.MaxPool1D)."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class ChannelsLastAvgPool1d(nn.AvgPool1d):
    """nn.AvgPool1d on [B, L, C] (microformer.AvgPool1D; count_include_pad=True)."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class LearnedPositionalEmbedding(nn.Module):
    """x [B,S,E] + weight[:S], weight [max_len, E] learned (microformer.LearnedPositionalEmbedding)."""

    def __init__(self, max_len, embed_dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, embed_dim))

    def forward(self, x):
        return x + self.weight[:x.shape[1]]


class SelfAttention(nn.MultiheadAttention):
    """microformer.Attention as a layer of an nn.Sequential: forward(x [B,S,E], key_padding_mask=None)
    -> [B,S,E], self-attention (causal=True: each position sees itself and the ones before).
    nn.MultiheadAttention(E, H, batch_first=True) underneath: same parameters and state_dict names
    (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias)."""

    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0, causal=False, max_len=None):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=True)
        self.causal = causal
        self.max_len = max_len

    def forward(self, x, key_padding_mask=None):
        mask = None
        if self.causal:
            S = x.shape[1]
            mask = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)     # True = hidden
        return super().forward(x, x, x, key_padding_mask=key_padding_mask, attn_mask=mask,
                               need_weights=False, is_causal=self.causal)[0]


class Reshape(nn.Module):
    """x [B, ...] -> [B, *shape] (microformer.Reshape: the batch axis stays first)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x):
        return x.reshape((x.shape[0],) + self.shape)


def _one(v, where, m, what):
    # a torch 1-d size: an int or a 1-tuple
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            _refuse(where, m, "%s=%r is not one-dimensional" % (what, v))
        v = v[0]
    if not isinstance(v, int):
        _refuse(where, m, "%s=%r is not supported (an int is)" % (what, v))
    return v


def _torch_activation(kind):
    return {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU("tanh"), "tanh": nn.Tanh,
            "sigmoid": nn.Sigmoid, "leaky_relu": lambda: nn.LeakyReLU(0.01)}[kind]()


def _activation_kind(m, where):
    if isinstance(m, nn.ReLU):
        return "relu"
    if isinstance(m, nn.GELU):
        return "gelu_tanh" if m.approximate == "tanh" else "gelu"
    if isinstance(m, nn.Tanh):
        return "tanh"
    if isinstance(m, nn.Sigmoid):
        return "sigmoid"
    if isinstance(m, nn.LeakyReLU):
        if m.negative_slope != 0.01:
            raise ValueError("from_torch: %s: LeakyReLU(negative_slope=%r) is not supported (microformer's "
                             "leaky_relu has slope 0.01)" % (where, m.negative_slope))
        return "leaky_relu"
    return None


def _refuse(where, m, why):
    raise ValueError("from_torch: %s (%s): %s" % (where, type(m).__name__, why))


def _p(p, ignore_dropout):
    return 0.0 if ignore_dropout else float(p)


SUPPORTED = ("Linear, ReLU, GELU, Tanh, Sigmoid, LeakyReLU(0.01), Dropout, MultiheadAttention, LayerNorm, "
             "Embedding, TransformerEncoderLayer, TransformerDecoderLayer, Sequential, Unflatten(1, ...), "
             "Flatten (before a Linear), Conv1d / MaxPool1d / AvgPool1d / AdaptiveAvgPool1d(1) on [B, C, L], "
             "and torch_io's SelfAttention, Reshape, Seq2SeqTransformer, GlobalAvgPool, PositionalEncoding, "
             "FeedForward, LearnedPositionalEmbedding, ChannelsLastConv1d / MaxPool1d / AvgPool1d")

# Layouts: torch's Conv1d and pools take channels first, [B, C, L]; microformer's take [B, L, C].
# The converted model takes [B, L, C] and runs every Conv1d / pool on that layout (their weights
# are the same); where torch flattens [B, C, L] (index c*L + l), microformer flattens [B, L, C]
# (index l*C + c), so the Linear after that Flatten gets its input columns permuted.
_START, _FLAT, _CF, _CF_FLAT, _CF_POOLED = "start", "flat or channels-last", "[B, C, L]", \
    "[B, C*L] flattened from [B, C, L]", "[B, C, 1]"
_ELEMENTWISE = (nn.Dropout,)


def _torch_leaves(modules):
    for m in modules:
        if isinstance(m, nn.Sequential):
            yield from _torch_leaves(m)
        else:
            yield m


class _Conversion:
    """One walk over a torch module tree: the microformer model (no weights yet), the Linear
    weights whose columns differ in order ({state_dict key: (C, L)}), and what the input is."""

    def __init__(self, module, ignore_dropout):
        self.ignore_dropout = ignore_dropout
        self.perms = {}
        self.layout = _START
        self.channels = None        # C of a [B, C, L] tensor, when known
        self.channels_first = False  # the model's input is [B, C, L]
        self.in_channels = None     # C of that input
        self.model = self.convert(module, type(module).__name__, "")
        if self.layout in (_CF, _CF_FLAT, _CF_POOLED):
            _refuse(type(module).__name__, module, "its output is %s in torch but would be channels last "
                    "in microformer: end the model with nn.Flatten + nn.Linear (or AdaptiveAvgPool1d(1) + "
                    "Flatten + Linear), or write it on [B, L, C] with torch_io's ChannelsLastConv1d / "
                    "ChannelsLastMaxPool1d / ChannelsLastAvgPool1d" % self.layout)

    def _channels_first(self, where, m, keeps_channels):
        # m takes [B, C, L]: the model's input (first layer) or another conv/pool's output
        if self.layout == _START:
            self.channels_first = True
        elif self.layout != _CF:
            _refuse(where, m, "takes [B, C, L], but its input here is %s; a Conv1d / pool must take the "
                    "model's input or follow another one" % self.layout)
        if not keeps_channels:
            if self.channels is None:       # the first Conv1d: the input's channels (pools keep them)
                self.in_channels = m.in_channels
            elif m.in_channels != self.channels:
                _refuse(where, m, "in_channels=%d, but its input has %d channels" % (m.in_channels, self.channels))
            self.channels = m.out_channels
        self.layout = _CF

    def _plain(self, where, m):
        # m takes flat or channels-last input, as microformer does
        if self.layout in (_CF, _CF_FLAT, _CF_POOLED):
            _refuse(where, m, "its input here is %s (after a Conv1d / pool / Flatten), which it cannot take "
                    "in microformer's layout; only %s may follow there" % (self.layout,
                    "nn.Flatten" if self.layout == _CF_POOLED else
                    "Conv1d / MaxPool1d / AvgPool1d / AdaptiveAvgPool1d(1) / nn.Flatten" if self.layout == _CF
                    else "nn.Linear") + ("; for a sequence layer after a Conv1d, write a module whose forward "
                                         "transposes to [B, L, C] (x.transpose(1, 2)) before it, or use "
                                         "ChannelsLastConv1d / ChannelsLastMaxPool1d / ChannelsLastAvgPool1d on "
                                         "[B, L, C]" if self.layout == _CF else ""))
        self.layout = _FLAT

    def _flatten_size(self, where, m, siblings, i):
        # nn.Flatten's per-sample size: the in_features of the Linear it feeds (microformer's
        # Reshape needs it; torch works it out at run time)
        for s in _torch_leaves(siblings[i + 1:]):
            if isinstance(s, nn.Linear):
                return s.in_features
            if not (isinstance(s, _ELEMENTWISE) or _activation_kind(s, where)):
                break
        _refuse(where, m, "must be followed by an nn.Linear (activations and dropout may come between): its "
                "size comes from that Linear's in_features")

    def convert(self, m, where, prefix, siblings=None, i=None):
        ign = self.ignore_dropout
        kind = _activation_kind(m, where)
        if kind:
            return mf.ActivationLayer(kind)
        if isinstance(m, nn.Dropout):
            return mf.Dropout(_p(m.p, ign))
        if isinstance(m, nn.Sequential):
            kids = list(m)
            return mf.Sequential([self.convert(c, "%s[%d]" % (where, j), "%s%d." % (prefix, j), kids, j)
                                  for j, c in enumerate(kids)])
        if isinstance(m, (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)) \
                and not isinstance(m, (ChannelsLastConv1d, ChannelsLastMaxPool1d, ChannelsLastAvgPool1d)):
            return self._conv_pool(m, where)
        if isinstance(m, nn.Flatten):
            if m.start_dim != 1 or m.end_dim != -1:
                _refuse(where, m, "only Flatten(start_dim=1, end_dim=-1) is supported, got start_dim=%d, "
                        "end_dim=%d" % (m.start_dim, m.end_dim))
            n = self._flatten_size(where, m, siblings or [], i)
            if self.layout == _CF:
                if self.channels is None:
                    _refuse(where, m, "flattens [B, C, L] whose channel count C is unknown (the model starts with "
                            "a pool): the Linear after it cannot be reordered")
                if n % self.channels:
                    _refuse(where, m, "the next Linear's in_features=%d is not a multiple of the %d channels"
                            % (n, self.channels))
                self.layout = _CF_FLAT
            elif self.layout == _CF_FLAT:
                pass
            else:                       # [B, C, 1] -> [B, C], or flat / channels-last: same order both sides
                self.layout = _FLAT
            return mf.Reshape((n,))
        if isinstance(m, nn.Linear) and self.layout == _CF_FLAT:
            self.perms[prefix + "weight"] = (self.channels, m.in_features // self.channels)
            self.layout = _FLAT
            return mf.Dense(m.in_features, m.out_features, use_bias=m.bias is not None)
        if self.layout == _CF and isinstance(m, nn.Linear):
            _refuse(where, m, "would act on the L axis of [B, C, L] (microformer's tensor there is [B, L, C]): "
                    "put nn.Flatten() before it")
        self._plain(where, m)
        return self._layer(m, where)

    def _conv_pool(self, m, where):
        if isinstance(m, nn.Conv1d):
            self._channels_first(where, m, False)
            if m.padding_mode != "zeros":
                _refuse(where, m, "padding_mode=%r (only 'zeros')" % m.padding_mode)
            if isinstance(m.padding, str):
                _refuse(where, m, "padding=%r (an int is supported)" % m.padding)
            return mf.Conv1D(m.in_channels, m.out_channels, _one(m.kernel_size, where, m, "kernel_size"),
                             stride=_one(m.stride, where, m, "stride"), padding=_one(m.padding, where, m, "padding"),
                             dilation=_one(m.dilation, where, m, "dilation"), groups=m.groups,
                             use_bias=m.bias is not None)
        if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)):
            if isinstance(m, nn.AdaptiveMaxPool1d) or _one(m.output_size, where, m, "output_size") != 1:
                _refuse(where, m, "only AdaptiveAvgPool1d(1) (the mean over L) is supported")
            self._channels_first(where, m, True)
            self.layout = _CF_POOLED
            return mf.GlobalAvgPool()
        self._channels_first(where, m, True)
        return self._pool(m, where)

    def _pool(self, m, where):
        if isinstance(m, nn.MaxPool1d):
            if _one(m.dilation, where, m, "dilation") != 1 or m.ceil_mode or m.return_indices:
                _refuse(where, m, "only dilation=1, ceil_mode=False, return_indices=False")
            return mf.MaxPool1D(_one(m.kernel_size, where, m, "kernel_size"), _one(m.stride, where, m, "stride"),
                                _one(m.padding, where, m, "padding"))
        if m.ceil_mode or not m.count_include_pad:
            _refuse(where, m, "only ceil_mode=False, count_include_pad=True")
        return mf.AvgPool1D(_one(m.kernel_size, where, m, "kernel_size"), _one(m.stride, where, m, "stride"),
                            _one(m.padding, where, m, "padding"))

    def _layer(self, m, where):
        """A module on flat or channels-last input -> a microformer layer without weights."""
        ign = self.ignore_dropout
        if isinstance(m, Seq2SeqTransformer):
            blocks = ([self._layer(l, "%s.encoder.layers[%d]" % (where, i)) for i, l in enumerate(m.encoder.layers)]
                      + [self._layer(l, "%s.decoder.layers[%d]" % (where, i)) for i, l in enumerate(m.decoder.layers)])
            p = _p(m.src_pos.dropout.p, ign)
            ps = sorted(set([b.dropout for b in blocks] + [p, _p(m.tgt_pos.dropout.p, ign)]))
            if len(ps) != 1:
                _refuse(where, m, "its layers' dropouts differ (%s); Transformer(dropout=p) has one p"
                        % ", ".join("%g" % q for q in ps))
            kinds = sorted(set(b.ffn.kind for b in blocks))
            if len(kinds) != 1:
                _refuse(where, m, "its layers' activations differ (%s)" % ", ".join(kinds))
            for norm in (m.encoder.norm, m.decoder.norm) + tuple(
                    l for b in m.encoder.layers + m.decoder.layers for l in b.modules() if isinstance(l, nn.LayerNorm)):
                if norm.eps != 1e-5:
                    _refuse(where, m, "layer_norm_eps=%g (microformer's Transformer uses 1e-5)" % norm.eps)
            return mf.Transformer(m.src_embed.num_embeddings, m.tgt_embed.num_embeddings, m.d_model, m.nhead,
                                  m.encoder.layers[0].linear1.out_features, len(m.encoder.layers),
                                  len(m.decoder.layers), m.max_len, kinds[0],
                                  use_bias=m.generator.bias is not None, dropout=ps[0])
        if isinstance(m, ChannelsLastConv1d):
            if m.padding_mode != "zeros":
                _refuse(where, m, "padding_mode=%r (only 'zeros')" % m.padding_mode)
            return mf.Conv1D(m.in_channels, m.out_channels, _one(m.kernel_size, where, m, "kernel_size"),
                             stride=_one(m.stride, where, m, "stride"), padding=_one(m.padding, where, m, "padding"),
                             dilation=_one(m.dilation, where, m, "dilation"), groups=m.groups,
                             use_bias=m.bias is not None)
        if isinstance(m, (ChannelsLastMaxPool1d, ChannelsLastAvgPool1d)):
            return self._pool(m, where)
        if isinstance(m, LearnedPositionalEmbedding):
            return mf.LearnedPositionalEmbedding(m.weight.shape[0], m.weight.shape[1])
        if isinstance(m, nn.Linear):
            return mf.Dense(m.in_features, m.out_features, use_bias=m.bias is not None)
        if isinstance(m, nn.MultiheadAttention):
            if not m.batch_first:
                _refuse(where, m, "needs batch_first=True (microformer is [B,S,E])")
            if not m._qkv_same_embed_dim or m.bias_k is not None:
                _refuse(where, m, "kdim/vdim other than embed_dim and add_bias_kv are not supported")
            sa = isinstance(m, SelfAttention)
            return mf.Attention(m.embed_dim, m.num_heads, use_bias=m.in_proj_bias is not None,
                                causal=sa and m.causal, max_len=m.max_len if sa else None,
                                dropout=_p(m.dropout, ign))
        if isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) != 1 or not m.elementwise_affine or m.bias is None:
                _refuse(where, m, "only LayerNorm(E) over the last dimension with weight and bias is supported")
            return mf.LayerNorm(m.normalized_shape[0], eps=m.eps)
        if isinstance(m, nn.Embedding):
            if m.padding_idx is not None or m.max_norm is not None:
                _refuse(where, m, "padding_idx and max_norm are not supported")
            return mf.Embedding(m.num_embeddings, m.embedding_dim)
        if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            return self._transformer_layer(m, where)
        if isinstance(m, nn.Unflatten):
            if m.dim != 1:
                _refuse(where, m, "only Unflatten(1, shape) is supported ([B, n] -> [B, *shape])")
            return mf.Reshape(tuple(m.unflattened_size))
        if isinstance(m, Reshape):
            return mf.Reshape(m.shape)
        if isinstance(m, GlobalAvgPool):
            return mf.GlobalAvgPool()
        if isinstance(m, PositionalEncoding):
            return mf.PositionalEncoding(m.max_len, m.embed_dim, dropout=_p(m.dropout.p, ign))
        if isinstance(m, FeedForward):
            return mf.FeedForward(m.linear1.in_features, m.linear1.out_features, m.activation_name,
                                  use_bias=m.linear1.bias is not None, dropout=_p(m.dropout.p, ign))
        _refuse(where, m, "no microformer layer for it (supported: %s)" % SUPPORTED)

    def _transformer_layer(self, m, where):
        dec = isinstance(m, nn.TransformerDecoderLayer)
        if not m.norm_first and dec:
            _refuse(where, m, "needs norm_first=True (microformer's DecoderBlock is pre-norm; its EncoderBlock "
                              "is either)")
        if not m.self_attn.batch_first:
            _refuse(where, m, "needs batch_first=True")
        for norm in (m.norm1, m.norm2) + ((m.norm3,) if dec else ()):
            if norm.eps != 1e-5:
                _refuse(where, m, "layer_norm_eps=%g (microformer's blocks use 1e-5)" % norm.eps)
        ps = {"dropout": m.dropout.p, "dropout1": m.dropout1.p, "dropout2": m.dropout2.p,
              "self_attn.dropout": m.self_attn.dropout}
        if dec:
            ps["dropout3"] = m.dropout3.p
            ps["multihead_attn.dropout"] = m.multihead_attn.dropout
        if len(set(ps.values())) != 1 and not self.ignore_dropout:
            _refuse(where, m, "its dropouts differ (%s); %s(dropout=p) has one p for all %d"
                    % (", ".join("%s=%g" % kv for kv in sorted(ps.items())),
                       "DecoderBlock" if dec else "EncoderBlock", len(ps)))
        act = m.activation
        if isinstance(act, nn.Module):
            kind = _activation_kind(act, where + ".activation")
        else:
            kind = {torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu"}.get(act)
        if kind is None:
            _refuse(where, m, "activation %r is not supported (relu, gelu, nn.GELU('tanh'))" % (act,))
        p = _p(m.dropout.p, self.ignore_dropout)
        if dec:
            return mf.DecoderBlock(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                                   activation=kind, use_bias=m.linear1.bias is not None, dropout=p)
        kw = {} if m.norm_first else {"norm_first": False}
        return mf.EncoderBlock(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                               activation=kind, use_bias=m.linear1.bias is not None, dropout=p, **kw)


def _permute(sd, perms, inverse=False):
    """The state dict with each Linear weight's input columns reordered: torch's c*L + l ->
    microformer's l*C + c (inverse: back)."""
    out = dict(sd)
    for key, (C, L) in perms.items():
        w = torch.as_tensor(sd[key])
        n = w.shape[0]
        if inverse:
            out[key] = w.reshape(n, L, C).transpose(1, 2).reshape(n, C * L).contiguous()
        else:
            out[key] = w.reshape(n, C, L).transpose(1, 2).reshape(n, L * C).contiguous()
    return out


def from_torch(module, ignore_dropout=False):
    """The microformer model for a supported torch module tree, with its weights. A model whose
    torch input is channels first ([B, C, L]: it starts with nn.Conv1d or a pool) takes [B, L, C]
    in microformer; the Linear after a Flatten of [B, C, L] gets its columns reordered to match."""
    return _from_torch(module, ignore_dropout)[0]


def _sequential_path(module):
    # an nn.Sequential, a torch.nn module or one of this file's: the module tree walk; a module with
    # a forward of its own: its graph (torch_fx.py)
    return isinstance(module, nn.Sequential) or type(module).__module__.startswith("torch.nn") or \
        type(module).__module__ in ("torch_io", __name__)


def _convert(module, ignore_dropout):
    """The conversion of `module` (its .model without weights, .perms, .channels_first, .in_channels)."""
    if _sequential_path(module):
        return _Conversion(module, ignore_dropout)
    import torch_fx
    c = torch_fx.convert(module, ignore_dropout, sys.modules[__name__])
    for note in c.notes:
        print("note: " + note)
    return c


def _from_torch(module, ignore_dropout=False):
    c = _convert(module, ignore_dropout)
    sd = _permute({k: v.detach() for k, v in module.state_dict().items()}, c.perms)
    unused = sorted(set(sd) - set(c.model.state_dict()))
    if unused:
        raise ValueError("from_torch: %s: its state_dict holds %s, which its forward never uses (the converted "
                         "model would lose them and load_into could not give them back): remove them from the module"
                         % (type(module).__name__, ", ".join(unused)))
    try:
        c.model.load_state_dict(sd)
    except ValueError as e:
        raise ValueError("from_torch: %s: its state_dict does not fit the layers its forward uses: %s"
                         % (type(module).__name__, str(e).split(": ", 1)[-1]))
    return c.model, c


def _weights_only_spec(spec):
    # the spec without dropout rates (they are not weights: a module trained with dropout takes the
    # weights of a checkpoint converted with --ignore-dropout)
    if isinstance(spec, dict):
        return {k: _weights_only_spec(v) for k, v in spec.items()
                if k not in ("dropout", "format") and not (k == "p" and spec.get("type") == "Dropout")}
    if isinstance(spec, list):
        return [_weights_only_spec(v) for v in spec]
    return spec


def load_into(module, checkpoint_or_model):
    """Put a microformer checkpoint's weights (a path, or a model) into your own torch module, the
    one from_torch converted (channels-first Conv1d and all): the Linear after a channels-first
    Flatten gets its columns back in torch's order, and module.load_state_dict(strict=True) takes
    the rest by name. ValueError when the checkpoint's architecture differs from the module's
    (dropout rates aside). Returns the module."""
    model = checkpoint_or_model
    where = "the model"
    if isinstance(model, (str, os.PathLike)):
        where = "checkpoint %s" % os.fspath(model)
        model = load_model(os.fspath(model))
    c = _convert(module, True)
    diff = difference(_weights_only_spec(to_spec(model)), _weights_only_spec(to_spec(c.model)),
                      (where, "the torch module"))
    if diff:
        raise ValueError("load_into: %s does not fit the torch module: %s" % (where, diff))
    sd = {k: torch.tensor(v.tolist(), dtype=torch.float32) for k, v in model.state_dict().items()}
    module.load_state_dict(_permute(sd, c.perms, inverse=True), strict=True)
    return module


def apply_adapter(module, adapter_path):
    """Merge an adapter file (checkpoint.save_adapter, the board's s.save_adapter) into your torch
    module, the one whose weights are the adapter's base: every LoRA adapter as one add,
    weight += (alpha/r) * lora_B @ lora_A (q/k/v: rows 0:E, E:2E, 2E:3E of in_proj_weight), and
    the other trained tensors (an unfrozen head, biases) copied in. ValueError naming the file
    when it is not an adapter or names a tensor the module lacks. Returns the module."""
    path = os.fspath(adapter_path)
    meta, tensors = checkpoint.read(path)
    if not isinstance(meta.get("adapter_of"), dict):
        raise ValueError("apply_adapter: %s is not an adapter file (its metadata has no 'adapter_of')" % path)
    model, c = _from_torch(module, True)
    groups = meta.get("lora") or []
    if groups:
        from microformer.lora import add_lora
        for g in groups:
            add_lora(model, g["rank"], g["alpha"], g["targets"])
    named = dict(model.named_params())
    for name, shape, data in tensors:
        p = named.get(name)
        if p is None:
            raise ValueError("apply_adapter: %s holds tensor %r, which the module's model %s lacks"
                             % (path, name, checkpoint.model_tag(model)))
        if tuple(p.shape) != tuple(shape):
            raise ValueError("apply_adapter: %s: tensor %r is %r, the module's is %r" % (path, name, tuple(shape),
                                                                                         tuple(p.shape)))
        p.data[:] = data
    # the plain trained tensors through the state dict (names and layouts as load_into)
    sd = {k: torch.tensor(v.tolist(), dtype=torch.float32) for k, v in model.state_dict().items()
          if ".lora_" not in "." + k}
    module.load_state_dict(_permute(sd, c.perms, inverse=True), strict=True)
    # each adapter as one add into its torch weight
    full = model.state_dict()
    own = module.state_dict()
    for g in groups:
        scale = g["alpha"] / g["rank"]
        for t in g["targets"]:
            pre = t + "." if t else ""
            A = torch.tensor(full[pre + "lora_A.weight"].tolist(), dtype=torch.float64)
            B = torch.tensor(full[pre + "lora_B.weight"].tolist(), dtype=torch.float64)
            delta = scale * (B @ A)
            leaf = t.rsplit(".", 1)[-1]
            if leaf in ("q_proj", "k_proj", "v_proj"):
                key = t[:-len(leaf)] + "in_proj_weight"
                E = delta.shape[0]
                rows = slice(E * "qkv".index(leaf[0]), E * ("qkv".index(leaf[0]) + 1))
            else:
                key = pre + "weight"
                rows = slice(None)
            if key not in own:
                raise ValueError("apply_adapter: %s: the adapter on %r has no weight %r in the module"
                                 % (path, t, key))
            if key in c.perms:
                delta = _permute({key: delta}, {key: c.perms[key]}, inverse=True)[key]
            with torch.no_grad():
                w = own[key]
                w[rows] = (w[rows].double() + delta).to(w.dtype)
    return module


def _to_module(layer, where):
    name = type(layer).__name__
    if name == "NamedSequential":
        raise ValueError("to_torch: %s is a model converted from a torch module with its own forward (its names "
                         "are that module's): put its weights back into that module with load_into(module, ...) "
                         "(on the command line: --model FILE.py:FACTORY)" % where)
    if isinstance(layer, mf.Sequential):
        return nn.Sequential(*[_to_module(l, "%s[%d]" % (where, i)) for i, l in enumerate(layer.layers)])
    if isinstance(layer, mf.Transformer):
        return Seq2SeqTransformer(layer.src_vocab, layer.tgt_vocab, layer.embed_dim, layer.num_heads,
                                  layer.ffn_hidden, len(layer.encoder), len(layer.decoder), layer.max_len,
                                  layer.activation, bias=bool(layer.use_bias), dropout=layer.dropout)
    if isinstance(layer, mf.Dense):
        return nn.Linear(layer.in_features, layer.out_features, bias=bool(layer.use_bias))
    if isinstance(layer, mf.ActivationLayer):
        return _torch_activation(layer.kind)
    if isinstance(layer, mf.Dropout):
        return nn.Dropout(layer.p)
    if isinstance(layer, mf.Attention):
        # kv_tile is how microformer computes it (torch picks its own kernel)
        return SelfAttention(layer.embed_dim, layer.num_heads, bias=bool(layer.use_bias), dropout=layer.dropout,
                             causal=layer.causal, max_len=layer.max_len)
    if isinstance(layer, mf.LayerNorm):
        return nn.LayerNorm(layer.dim, eps=layer.eps)
    if isinstance(layer, mf.Embedding):
        return nn.Embedding(layer.vocab, layer.embed_dim)
    if isinstance(layer, mf.EncoderBlock):
        act = {"relu": "relu", "gelu": "gelu"}.get(layer.ffn.kind) or _torch_activation(layer.ffn.kind)
        with warnings.catch_warnings():     # torch notes that norm_first keeps nested tensors off
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            return nn.TransformerEncoderLayer(layer.embed_dim, layer.attn.num_heads, layer.ffn.hidden,
                                              dropout=layer.dropout, activation=act, batch_first=True,
                                              norm_first=getattr(layer, "norm_first", True),
                                              bias=bool(layer.attn.use_bias))
    if isinstance(layer, mf.DecoderBlock):
        act = {"relu": "relu", "gelu": "gelu"}.get(layer.ffn.kind) or _torch_activation(layer.ffn.kind)
        return nn.TransformerDecoderLayer(layer.embed_dim, layer.self_attn.num_heads, layer.ffn.hidden,
                                          dropout=layer.dropout, activation=act, batch_first=True, norm_first=True,
                                          bias=bool(layer.self_attn.use_bias))
    if isinstance(layer, mf.Reshape):
        return Reshape(layer.shape)
    if isinstance(layer, mf.GlobalAvgPool):
        return GlobalAvgPool()
    if type(layer) is mf.PositionalEncoding:          # (LearnedPositionalEmbedding derives from it)
        return PositionalEncoding(layer.max_len, layer.embed_dim, layer.dropout)
    if isinstance(layer, mf.FeedForward):
        return FeedForward(layer.embed_dim, layer.hidden, layer.kind, bias=bool(layer.fc1.use_bias),
                           dropout=layer.dropout)
    if isinstance(layer, mf.Conv1D):
        return ChannelsLastConv1d(layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
                                  padding=layer.padding, dilation=layer.dilation, groups=layer.groups,
                                  bias=bool(layer.use_bias))
    if isinstance(layer, mf.MaxPool1D):
        return ChannelsLastMaxPool1d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, mf.AvgPool1D):
        return ChannelsLastAvgPool1d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, mf.LearnedPositionalEmbedding):
        return LearnedPositionalEmbedding(layer.max_len, layer.embed_dim)
    raise ValueError("to_torch: %s is a %s, which has no torch counterpart here" % (where, name))


def to_torch(model):
    """A torch module that computes what the microformer model computes, on the same layout
    ([B, L, C] for Conv1D / pools: torch_io's ChannelsLast modules), with its weights; state_dict
    names are the same on both sides. (load_into puts the weights into your own module instead.)"""
    module = _to_module(model, "model")
    from microformer import quant
    n8 = [n for n, p in model.named_params() if quant.is_int8(p)] if hasattr(model, "named_params") else []
    if n8:
        print("to_torch: %d int8 weights exported dequantized (float32 q * scale): %s" % (len(n8), ", ".join(n8)))
    sd = {k: torch.tensor(v.tolist(), dtype=torch.float32) for k, v in model.state_dict().items()}
    module.load_state_dict(sd, strict=True)
    return module


# ---- the command line -------------------------------------------------------------------

def _fail(msg):
    raise SystemExit("torch_io: " + msg)


def _first_line(e):
    s = " ".join(str(e).split())
    return "%s: %s" % (type(e).__name__, s[:300]) if s else type(e).__name__


def _read_pt(path, trust):
    """What a torch file holds. weights_only=True (tensors and plain containers; nothing from
    the file runs) unless trust."""
    if not os.path.isfile(path):
        _fail("%s: no such file" % path)
    try:
        with warnings.catch_warnings():     # torch's note on pickle protocols: the error below says more
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as e:
        msg = str(e)
        if not trust and "weights_only" in msg:
            g = re.search(r"Unsupported global: GLOBAL (\S+)", msg)
            if g:
                _fail("%s holds %s, which only code from the file could rebuild (e.g. a whole module saved with "
                      "torch.save(module)); nothing from it was run. Safe: save module.state_dict() and pass "
                      "--model FILE.py:FACTORY; or, if you trust the file, --trust (runs code from it)"
                      % (path, g.group(1)))
            why = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", msg)
            _fail("%s: not a readable torch file (%s); nothing from it was run (a plain pickle, or a whole module "
                  "saved with torch.save(module), needs --trust, which runs code from it)"
                  % (path, why.group(1).strip() if why else _first_line(e)))
        _fail("%s: not a readable torch file (%s)" % (path, _first_line(e)))
    except Exception as e:        # zip / pickle / EOF errors of a corrupt or empty file
        _fail("%s: not a readable torch file (%s)" % (path, _first_line(e)))


def _factory_module(arg):
    """--model FILE.py:FACTORY: import the user's own file (their code runs: it is theirs) and call
    FACTORY() for the module the state dict belongs to."""
    path, sep, name = arg.rpartition(":")
    if not sep or not path or not name:
        _fail("--model must be FILE.py:FACTORY (a Python file and the function or class in it that builds "
              "the module, e.g. mymodel.py:build), got %r" % arg)
    if not os.path.isfile(path):
        _fail("--model %s: no such file" % path)
    modname = "torch_io_model_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None:
        _fail("--model %s: not a Python file" % path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))      # it may import its neighbours
    spec.loader.exec_module(mod)
    f = getattr(mod, name, None)
    if not callable(f):
        _fail("--model %s has no function or class %r (it defines: %s)"
              % (path, name, ", ".join(sorted(k for k in vars(mod) if not k.startswith("_")))))
    m = f()
    if not isinstance(m, nn.Module):
        _fail("--model %s: %s() returned a %s, not a torch.nn.Module" % (arg, name, type(m).__name__))
    return m


F32_MAX = 3.4028234663852886e38


def _check_values(sd, path):
    """One line naming the tensor, the index and the value unless every floating value of the
    state_dict is finite and within float32 (a 1e39 in a float64 tensor would become inf)."""
    for k, v in sd.items():
        if not torch.is_tensor(v) or not v.is_floating_point() or v.numel() == 0:
            continue
        flat = v.detach().reshape(-1).double()
        bad = ~torch.isfinite(flat) | (flat.abs() > F32_MAX)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            _fail("%s: tensor %r holds %r at flat index %d (%d such values): weights must be finite float32 "
                  "numbers (|w| <= %.8g)" % (path, k, float(flat[i]), i, int(bad.sum()), F32_MAX))


def _module_from_pt(path, model_arg, trust):
    obj = _read_pt(path, trust)
    if isinstance(obj, nn.Module):
        if model_arg:
            _fail("%s holds a whole module; --model is for files that hold a state_dict" % path)
        _check_values(obj.state_dict(), path)
        return obj, type(obj).__name__
    if not isinstance(obj, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items()):
        keys = list(obj)[:8] if isinstance(obj, dict) else None
        _fail("%s holds a %s%s, not a state_dict (names -> tensors): save it with "
              "torch.save(module.state_dict(), path)" % (path, type(obj).__name__,
                                                         " with keys %s" % keys if keys is not None else ""))
    if not model_arg:
        _fail("%s holds a state_dict (%d tensors), which does not say the architecture: pass --model "
              "FILE.py:FACTORY, your Python file and the function in it that builds the module" % (path, len(obj)))
    _check_values(obj, path)
    module = _factory_module(model_arg)
    try:
        module.load_state_dict(obj, strict=True)
    except RuntimeError as e:
        _fail("%s does not fit the module --model %s builds: %s" % (path, model_arg, _first_line(e)))
    return module, "%s from %s" % (type(module).__name__, os.path.basename(model_arg))


def _read_meta(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        _fail("--meta %s: cannot read it (%s)" % (path, _first_line(e)))
    try:
        return json.loads(text)
    except ValueError as e:
        _fail("--meta %s: not valid JSON (%s)" % (path, e))


def _parse_shape(text):
    try:
        shape = [int(v) for v in text.split(",")]
    except ValueError:
        shape = None
    if not shape or len(shape) > 2 or min(shape) < 1:
        _fail("--input-shape must be F (flat features) or L,C (a window of L readings of C channels), "
              "positive ints, got %r" % text)
    return shape


def _leaves(model):
    if isinstance(model, mf.Sequential):
        return [x for l in model.layers for x in _leaves(l)]
    return [model]


def _run_shape(model, shape):
    """The output shape for one example of `shape`, or the error (a forward in eval mode)."""
    try:
        model.eval()
        return tuple(model.forward(mf.Tensor.zeros((1,) + tuple(shape))).shape), None
    except ValueError as e:
        return None, str(e)
    finally:
        model.train()


def _input_shape(conv, given, where):
    """(input_shape, how): given (checked against the model), or what the torch model says;
    (None, why) when it cannot say."""
    model = conv.model
    if given is not None:
        if not isinstance(given, list) or len(given) not in (1, 2) or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in given):
            _fail("%s: input_shape must be [F] or [L, C] (positive ints), got %r" % (where, given))
        _, err = _run_shape(model, given)
        if err:
            _fail("%s: input_shape %s does not fit the model (one example as microformer takes it: [L, C] "
                  "channels last): %s" % (where, given, err))
        return given, None
    if conv.channels_first:
        return None, ("the torch model takes [B, C, L] (Conv1d / pool first), microformer's [B, L, C]: its "
                      "input_shape is [L, %s], and L cannot be read off the module: give it with "
                      "--input-shape L,%s or 'input_shape' in the metadata"
                      % ((conv.in_channels,) * 2 if conv.in_channels else ("C", "C")))
    first = _leaves(model)[0]
    if isinstance(first, mf.Dense):
        F = first.in_features
        _, err = _run_shape(model, [F])
        if err is None:
            return [F], "input_shape: [%d] (flat features: the first Linear's in_features)" % F
        return None, ("the model does not take flat features [%d] (%s): it takes a sequence [B, L, %d]; give "
                      "input_shape [L, %d] with --input-shape L,%d or in the metadata" % (F, err, F, F, F))
    return None, ("its input shape cannot be read off the module (it starts with %s): give input_shape with "
                  "--input-shape or in the metadata" % type(first).__name__)


def _session_meta(conv, meta, given, meta_path):
    """The metadata to store: checked with microformer.meta.check (notes printed) when --meta was
    given; without it, what the checkpoint lacks for finetune.Session is printed."""
    where = "--meta %s" % meta_path if meta_path else "metadata"
    first = _leaves(conv.model)[0]
    if isinstance(first, (mf.Embedding, mf.Transformer)):
        print("metadata: not checked (the model takes token ids; finetune.Session fine-tunes models on "
              "feature vectors and windows)")
        return meta
    shape, how = _input_shape(conv, given, where)
    if shape is None and meta_path:
        _fail("%s: %s" % (where, how))
    out = dict(meta)
    if shape is not None:
        out["input_shape"] = shape
    if not meta_path:
        print("note: no --meta: finetune.Session cannot open this checkpoint (it needs at least 'classes', the "
              "label of each output, and input_shape); mf.load_model can")
        if shape is None:
            print("note: " + how)
        return out
    if how and given is None:
        print("metadata: " + how)
    try:
        out, notes = session_meta.check(out, where)
    except session_meta.MetaError as e:
        _fail(str(e))
    outputs, err = _run_shape(conv.model, out["input_shape"])
    want = session_meta.num_outputs(out)
    if outputs is not None and (len(outputs) != 2 or outputs[1] != want):
        key = "classes" if out["task"] == "classify" else "targets"
        _fail("%s: metadata %r names %d outputs, the model gives %s per example" % (where, key, want, list(outputs[1:])))
    for n in notes:
        print("metadata default: " + n)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="torch file <-> microformer checkpoint. Nothing in a .pt runs unless --trust is given.")
    ap.add_argument("src", help="model.pt (a state_dict; or a whole module with --trust) or model.mfck")
    ap.add_argument("--out", required=True, help="model.mfck or model.pt")
    ap.add_argument("--model", metavar="FILE.py:FACTORY",
                    help="your Python file and the function (or class) in it that builds your torch module: "
                         "imports and runs that file. .pt -> .mfck: the module the state_dict belongs to; "
                         ".mfck -> .pt: write the state_dict in your module's own layout (load_into)")
    ap.add_argument("--trust", action="store_true",
                    help="load a .pt that holds a whole pickled module (torch.save(module)): THIS RUNS CODE "
                         "FROM THE FILE; use it only for files you made yourself")
    ap.add_argument("--meta", help="a JSON object of session metadata to check and store (classes, input_shape, "
                                   "features, mean, std, ...; see lib/microformer/meta.py)")
    ap.add_argument("--input-shape", metavar="F or L,C",
                    help="one example's shape as microformer takes it: F features, or L readings of C channels "
                         "(channels last, also for a torch model that takes [B, C, L])")
    ap.add_argument("--ignore-dropout", action="store_true", help="convert every dropout as p = 0")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    a = ap.parse_args(argv)
    _check_out(a.out)
    if os.path.exists(a.out) and not a.force:
        _fail("%s exists; pass --force to overwrite it" % a.out)
    if a.src.endswith(".mfck"):
        return _to_pt(a)
    given = _parse_shape(a.input_shape) if a.input_shape else None
    meta = {}
    if a.meta:
        meta = _read_meta(a.meta)
        if not isinstance(meta, dict):
            _fail("--meta %s: metadata must be a JSON object (dict), got %s" % (a.meta, type(meta).__name__))
        if given is not None and "input_shape" in meta and meta["input_shape"] != given:
            _fail("--input-shape %s and --meta %s's input_shape %r differ" % (a.input_shape, a.meta,
                                                                            meta["input_shape"]))
        if given is None:
            given = meta.get("input_shape")
    if a.trust:
        print("torch_io: --trust: loading %s runs code from it" % a.src)
    module, what = _module_from_pt(a.src, a.model, a.trust)
    try:
        model, conv = _from_torch(module, ignore_dropout=a.ignore_dropout)
    except ValueError as e:
        _fail(" ".join(str(e).split()))
    if conv.channels_first:
        print("layout: the torch module takes [B, C, L]; the microformer model takes [B, L, C] (channels last)%s"
              % (": the Linear after Flatten has its columns reordered" if conv.perms else ""))
    meta = _session_meta(conv, meta, given, a.meta)
    meta["spec"] = to_spec(model)
    meta.setdefault("source", "torch %s: %s" % (torch.__version__, what))
    try:
        n = checkpoint.save(a.out, model, meta)
    except (OSError, ValueError) as e:
        _fail("--out %s: cannot write the checkpoint (%s)" % (a.out, _first_line(e)))
    print("wrote %s (%d bytes): %d params, %s" % (a.out, n, model.param_count(),
                                                  " -> ".join(l["type"] for l in meta["spec"].get("layers", [meta["spec"]]))))


def _check_out(out):
    # --out names a file in a folder that exists: said before anything is read or converted
    if os.path.isdir(out):
        _fail("--out %s is a folder; name the file to write (e.g. %s)" % (out, os.path.join(out, "model.mfck")))
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        _fail("--out %s: the folder %s does not exist (make it first)" % (out, folder))


def _to_pt(a):
    try:
        model = load_model(a.src)
    except (checkpoint.CheckpointError, ValueError, OSError) as e:
        _fail("%s: cannot open it as a checkpoint (%s)" % (a.src, _first_line(e)))
    if a.model:
        module = _factory_module(a.model)
        try:
            load_into(module, model)
        except (ValueError, RuntimeError) as e:
            _fail("%s does not fit the module --model %s builds: %s" % (a.src, a.model, _first_line(e)))
        what = "the state_dict of your module (--model %s)" % a.model
    else:
        try:
            module = to_torch(model)
        except ValueError as e:
            _fail("%s: %s" % (a.src, " ".join(str(e).split())))
        what = ("a state_dict for torch_io.to_torch(mf.load_model(%r)) (channels last; --model FILE.py:FACTORY "
                "writes your own module's layout instead)" % a.src)
    sd = {k: v.detach().clone() for k, v in module.state_dict().items()}
    tmp = a.out + ".part"
    try:                            # all or nothing: a failed write leaves no file behind
        torch.save(sd, tmp)
        os.replace(tmp, a.out)
    except (OSError, RuntimeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        _fail("--out %s: cannot write it (%s)" % (a.out, _first_line(e)))
    print("wrote %s: %s; torch.load(path, weights_only=True) reads it" % (a.out, what))


if __name__ == "__main__":
    # run as the importable module, so that the modules a --model file or a trusted .pt builds
    # from torch_io (e.g. GlobalAvgPool) are the very classes from_torch checks for
    sys.path.insert(0, HERE)
    import torch_io
    torch_io.main()
