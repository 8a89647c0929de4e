"""PyTorch in and out: torch modules <-> microformer models, and torch files <-> checkpoints.

    from torch_io import from_torch, to_torch
    model = from_torch(torch_module)       # microformer model with the same weights
    module = to_torch(model)               # and back (torch.nn modules, state_dict names kept)

    python host/torch_io.py model.pt --out model.mfck [--meta meta.json]
        model.pt: a whole module saved with torch.save(module, 'model.pt'); writes a checkpoint
        that carries its spec, so mf.load_model('model.mfck') rebuilds it on the board.
    python host/torch_io.py model.mfck --out model.pt
        the reverse: a checkpoint (with its spec) to a torch module file.

Supported: nn.Linear, nn.ReLU / GELU (both forms) / Tanh / Sigmoid / LeakyReLU(0.01), nn.Dropout,
nn.MultiheadAttention (batch_first=True; its dropout), nn.LayerNorm, nn.Embedding,
nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (norm_first=True, batch_first=True), nn.Sequential, nn.Unflatten(1, ...),
and this file's GlobalAvgPool, PositionalEncoding, FeedForward, LearnedPositionalEmbedding modules and
its channels-last ChannelsLastConv1d / ChannelsLastMaxPool1d / ChannelsLastAvgPool1d (nn.Conv1d,
nn.MaxPool1d, nn.AvgPool1d over [B, L, C]: microformer's layout; the plain torch modules take
[B, C, L] and are refused, since converting them would change what the model computes). Anything else is named in
the error. Dropout probabilities cross over both ways (nn.Dropout <-> mf.Dropout, MultiheadAttention's
dropout <-> Attention(dropout=p), TransformerEncoderLayer's dropout <-> EncoderBlock(dropout=p),
TransformerDecoderLayer's dropout <-> DecoderBlock(dropout=p); a layer whose dropouts differ is refused);
this file's Seq2SeqTransformer (nn.Transformer with embeddings, positional encodings and output
projection) <-> microformer.Transformer, state_dict names equal;
the masks are drawn by each side's own generator, so only eval-mode outputs can be equal.
ignore_dropout=True converts every dropout as p = 0. torch is needed on the host only; the board
never imports it.
"""
import argparse
import json
import math
import os
import sys
import warnings

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import microformer as mf  # noqa: E402
from microformer import checkpoint  # noqa: E402
from microformer.spec import load_model, to_spec  # noqa: E402


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


def _convert(m, where, ignore_dropout):
    """One torch module -> a microformer layer without weights."""
    kind = _activation_kind(m, where)
    if kind:
        return mf.ActivationLayer(kind)
    if isinstance(m, nn.Dropout):
        return mf.Dropout(_p(m.p, ignore_dropout))
    if isinstance(m, Seq2SeqTransformer):
        blocks = ([_convert(l, "%s.encoder.layers[%d]" % (where, i), ignore_dropout)
                   for i, l in enumerate(m.encoder.layers)]
                  + [_convert(l, "%s.decoder.layers[%d]" % (where, i), ignore_dropout)
                     for i, l in enumerate(m.decoder.layers)])
        p = _p(m.src_pos.dropout.p, ignore_dropout)
        ps = sorted(set([b.dropout for b in blocks] + [p, _p(m.tgt_pos.dropout.p, ignore_dropout)]))
        if len(ps) != 1:
            _refuse(where, m, "its layers' dropouts differ (%s); Transformer(dropout=p) has one p"
                    % ", ".join("%g" % q for q in ps))
        kinds = sorted(set(b.ffn.kind for b in blocks))
        if len(kinds) != 1:
            _refuse(where, m, "its layers' activations differ (%s)" % ", ".join(kinds))
        for norm in (m.encoder.norm, m.decoder.norm) + tuple(l for b in m.encoder.layers + m.decoder.layers
                                                             for l in b.modules() if isinstance(l, nn.LayerNorm)):
            if norm.eps != 1e-5:
                _refuse(where, m, "layer_norm_eps=%g (microformer's Transformer uses 1e-5)" % norm.eps)
        return mf.Transformer(m.src_embed.num_embeddings, m.tgt_embed.num_embeddings, m.d_model, m.nhead,
                              m.encoder.layers[0].linear1.out_features, len(m.encoder.layers),
                              len(m.decoder.layers), m.max_len, kinds[0],
                              use_bias=m.generator.bias is not None, dropout=ps[0])
    if isinstance(m, nn.Sequential):
        return mf.Sequential([_convert(c, "%s[%d]" % (where, i), ignore_dropout) for i, c in enumerate(m)])
    if isinstance(m, ChannelsLastConv1d):
        if m.padding_mode != "zeros":
            _refuse(where, m, "padding_mode=%r (only 'zeros')" % m.padding_mode)
        return mf.Conv1D(m.in_channels, m.out_channels, _one(m.kernel_size, where, m, "kernel_size"),
                         stride=_one(m.stride, where, m, "stride"), padding=_one(m.padding, where, m, "padding"),
                         dilation=_one(m.dilation, where, m, "dilation"), groups=m.groups,
                         use_bias=m.bias is not None)
    if isinstance(m, ChannelsLastMaxPool1d):
        if _one(m.dilation, where, m, "dilation") != 1 or m.ceil_mode or m.return_indices:
            _refuse(where, m, "only dilation=1, ceil_mode=False, return_indices=False")
        return mf.MaxPool1D(_one(m.kernel_size, where, m, "kernel_size"), _one(m.stride, where, m, "stride"),
                            _one(m.padding, where, m, "padding"))
    if isinstance(m, ChannelsLastAvgPool1d):
        if m.ceil_mode or not m.count_include_pad:
            _refuse(where, m, "only ceil_mode=False, count_include_pad=True")
        return mf.AvgPool1D(_one(m.kernel_size, where, m, "kernel_size"), _one(m.stride, where, m, "stride"),
                            _one(m.padding, where, m, "padding"))
    if isinstance(m, (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d)):
        _refuse(where, m, "takes [B, C, L]; microformer's layers take [B, L, C]: use torch_io's "
                          "ChannelsLast%s (same parameters and state_dict names)" % type(m).__name__)
    if isinstance(m, LearnedPositionalEmbedding):
        return mf.LearnedPositionalEmbedding(m.weight.shape[0], m.weight.shape[1])
    if isinstance(m, nn.Linear):
        return mf.Dense(m.in_features, m.out_features, use_bias=m.bias is not None)
    if isinstance(m, nn.MultiheadAttention):
        if not m.batch_first:
            _refuse(where, m, "needs batch_first=True (microformer is [B,S,E])")
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            _refuse(where, m, "kdim/vdim other than embed_dim and add_bias_kv are not supported")
        return mf.Attention(m.embed_dim, m.num_heads, use_bias=m.in_proj_bias is not None,
                            dropout=_p(m.dropout, ignore_dropout))
    if isinstance(m, nn.LayerNorm):
        if len(m.normalized_shape) != 1 or not m.elementwise_affine or m.bias is None:
            _refuse(where, m, "only LayerNorm(E) over the last dimension with weight and bias is supported")
        return mf.LayerNorm(m.normalized_shape[0], eps=m.eps)
    if isinstance(m, nn.Embedding):
        if m.padding_idx is not None or m.max_norm is not None:
            _refuse(where, m, "padding_idx and max_norm are not supported")
        return mf.Embedding(m.num_embeddings, m.embedding_dim)
    if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        dec = isinstance(m, nn.TransformerDecoderLayer)
        if not m.norm_first:
            _refuse(where, m, "needs norm_first=True (microformer's %s is pre-norm)"
                              % ("DecoderBlock" if dec else "EncoderBlock"))
        if not m.self_attn.batch_first:
            _refuse(where, m, "needs batch_first=True")
        ps = {"dropout": m.dropout.p, "dropout1": m.dropout1.p, "dropout2": m.dropout2.p,
              "self_attn.dropout": m.self_attn.dropout}
        if dec:
            ps["dropout3"] = m.dropout3.p
            ps["multihead_attn.dropout"] = m.multihead_attn.dropout
        if len(set(ps.values())) != 1 and not ignore_dropout:
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
        if dec:
            return mf.DecoderBlock(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                                   activation=kind, use_bias=m.linear1.bias is not None,
                                   dropout=_p(m.dropout.p, ignore_dropout))
        return mf.EncoderBlock(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                               activation=kind, use_bias=m.linear1.bias is not None,
                               dropout=_p(m.dropout.p, ignore_dropout))
    if isinstance(m, nn.Unflatten):
        if m.dim != 1:
            _refuse(where, m, "only Unflatten(1, shape) is supported ([B, n] -> [B, *shape])")
        return mf.Reshape(tuple(m.unflattened_size))
    if isinstance(m, GlobalAvgPool):
        return mf.GlobalAvgPool()
    if isinstance(m, PositionalEncoding):
        return mf.PositionalEncoding(m.max_len, m.embed_dim, dropout=_p(m.dropout.p, ignore_dropout))
    if isinstance(m, FeedForward):
        return mf.FeedForward(m.linear1.in_features, m.linear1.out_features, m.activation_name,
                              use_bias=m.linear1.bias is not None, dropout=_p(m.dropout.p, ignore_dropout))
    _refuse(where, m, "no microformer layer for it (supported: Linear, ReLU, GELU, Tanh, Sigmoid, Dropout, "
                      "LeakyReLU, MultiheadAttention, LayerNorm, Embedding, TransformerEncoderLayer, "
                      "TransformerDecoderLayer, "
                      "Sequential, Unflatten, and Seq2SeqTransformer/GlobalAvgPool/PositionalEncoding/FeedForward/"
                      "LearnedPositionalEmbedding/ChannelsLastConv1d/ChannelsLastMaxPool1d/"
                      "ChannelsLastAvgPool1d of torch_io)")


def from_torch(module, ignore_dropout=False):
    """The microformer model for a supported torch module tree, with its weights."""
    model = _convert(module, type(module).__name__, ignore_dropout)
    model.load_state_dict({k: v.detach() for k, v in module.state_dict().items()})
    return model


def _to_module(layer, where):
    name = type(layer).__name__
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
        # causal attention takes its mask at call time in torch: attn_mask=..., is_causal=True;
        # kv_tile is how microformer computes it (torch picks its own kernel)
        return nn.MultiheadAttention(layer.embed_dim, layer.num_heads, bias=bool(layer.use_bias),
                                     batch_first=True, dropout=layer.dropout)
    if isinstance(layer, mf.LayerNorm):
        return nn.LayerNorm(layer.dim, eps=layer.eps)
    if isinstance(layer, mf.Embedding):
        return nn.Embedding(layer.vocab, layer.embed_dim)
    if isinstance(layer, mf.EncoderBlock):
        act = {"relu": "relu", "gelu": "gelu"}.get(layer.ffn.kind) or _torch_activation(layer.ffn.kind)
        return nn.TransformerEncoderLayer(layer.embed_dim, layer.attn.num_heads, layer.ffn.hidden,
                                          dropout=layer.dropout, activation=act, batch_first=True, norm_first=True,
                                          bias=bool(layer.attn.use_bias))
    if isinstance(layer, mf.DecoderBlock):
        act = {"relu": "relu", "gelu": "gelu"}.get(layer.ffn.kind) or _torch_activation(layer.ffn.kind)
        return nn.TransformerDecoderLayer(layer.embed_dim, layer.self_attn.num_heads, layer.ffn.hidden,
                                          dropout=layer.dropout, activation=act, batch_first=True, norm_first=True,
                                          bias=bool(layer.self_attn.use_bias))
    if isinstance(layer, mf.Reshape):
        return nn.Unflatten(1, tuple(layer.shape))
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
    """torch.nn modules with the model's weights (state_dict names are the same on both sides)."""
    module = _to_module(model, "model")
    sd = {k: torch.tensor(v.tolist(), dtype=torch.float32) for k, v in model.state_dict().items()}
    module.load_state_dict(sd, strict=True)
    return module


def main(argv=None):
    ap = argparse.ArgumentParser(description="torch module file <-> microformer checkpoint")
    ap.add_argument("src", help="model.pt (a module saved with torch.save) or model.mfck")
    ap.add_argument("--out", required=True, help="model.mfck or model.pt")
    ap.add_argument("--meta", help="a JSON file of metadata to store in the checkpoint (classes, ...)")
    ap.add_argument("--ignore-dropout", action="store_true", help="convert every dropout as p = 0")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    a = ap.parse_args(argv)
    if os.path.exists(a.out) and not a.force:
        raise SystemExit("torch_io: %s exists; pass --force to overwrite it" % a.out)
    if a.src.endswith(".mfck"):
        module = to_torch(load_model(a.src))
        torch.save(module, a.out)
        print("wrote %s: %s" % (a.out, type(module).__name__))
        return
    obj = torch.load(a.src, weights_only=False)
    if not isinstance(obj, nn.Module):
        raise SystemExit("torch_io: %s holds a %s, not a module: save the whole module with "
                         "torch.save(module, path) (a state_dict alone does not say the architecture)"
                         % (a.src, type(obj).__name__))
    model = from_torch(obj, ignore_dropout=a.ignore_dropout)
    meta = {}
    if a.meta:
        with open(a.meta) as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise SystemExit("torch_io: --meta %s must hold a JSON object" % a.meta)
    meta["spec"] = to_spec(model)
    meta.setdefault("source", "torch %s: %s" % (torch.__version__, type(obj).__name__))
    n = checkpoint.save(a.out, model, meta)
    print("wrote %s (%d bytes): %d params, %s" % (a.out, n, model.param_count(),
                                                  " -> ".join(l["type"] for l in meta["spec"].get("layers", [meta["spec"]]))))


if __name__ == "__main__":
    # run as the importable module, so that pickled torch_io modules (e.g. PositionalEncoding)
    # are the very classes from_torch checks for
    sys.path.insert(0, HERE)
    import torch_io
    torch_io.main()
