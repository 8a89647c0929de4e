# microformer.spec: a model as plain data, and back.
#   to_spec(model) -> {"type": "Sequential", "layers": [{"type": "Dense", "in_features": 4, ...}, ...]}
#   from_spec(spec) -> the model (freshly initialised; a checkpoint fills in the weights)
# A spec is JSON-able: checkpoints carry it, so load_model(path) rebuilds a model with no code.
from .activation import ActivationLayer
from .attention import Attention
from .block import EncoderBlock
from .decoder import DecoderBlock, Transformer
from .dense import Dense
from .embedding import Embedding
from .feedforward import FeedForward
from .model import Sequential
from .norm import LayerNorm
from .pool import GlobalAvgPool
from .posenc import PositionalEncoding
from .reshape import Reshape
from .conv import Conv1D
from .pool1d import AvgPool1D, MaxPool1D
from .posembed import LearnedPositionalEmbedding
from .dropout import Dropout


def _opt(out, layer, defaults):
    # the arguments added after a layer's first spec appear only when they differ from their
    # default, so the specs (and checkpoints) of models without them stay as they were
    for k, d in defaults:
        v = getattr(layer, k)
        if v != d:
            out[k] = v
    return out

# every layer a spec may name: class, and its constructor arguments as read off an instance
_LAYERS = {
    "Dense": (Dense, lambda l: {"in_features": l.in_features, "out_features": l.out_features,
                                "use_bias": bool(l.use_bias)}),
    "Attention": (Attention, lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.num_heads,
                                        "use_bias": bool(l.use_bias), "causal": l.causal,
                                        "max_len": l.max_len}, l, (("dropout", 0.0), ("kv_tile", None)))),
    "ActivationLayer": (ActivationLayer, lambda l: {"kind": l.kind}),
    "Reshape": (Reshape, lambda l: {"shape": list(l.shape)}),
    "GlobalAvgPool": (GlobalAvgPool, lambda l: {}),
    "LayerNorm": (LayerNorm, lambda l: {"dim": l.dim, "eps": l.eps}),
    "FeedForward": (FeedForward, lambda l: _opt({"embed_dim": l.embed_dim, "hidden": l.hidden,
                                                 "activation": l.kind, "use_bias": bool(l.fc1.use_bias)},
                                                l, (("dropout", 0.0),))),
    "Embedding": (Embedding, lambda l: {"vocab": l.vocab, "embed_dim": l.embed_dim}),
    "PositionalEncoding": (PositionalEncoding, lambda l: _opt({"max_len": l.max_len, "embed_dim": l.embed_dim},
                                                              l, (("dropout", 0.0),))),
    "EncoderBlock": (EncoderBlock, lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.attn.num_heads,
                                                   "ffn_hidden": l.ffn.hidden, "causal": l.causal,
                                                   "activation": l.ffn.kind, "max_len": l.attn.max_len,
                                                   "use_bias": bool(l.attn.use_bias)},
                                                  l, (("dropout", 0.0), ("kv_tile", None)))),
    "Dropout": (Dropout, lambda l: {"p": l.p}),
    "DecoderBlock": (DecoderBlock, lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.self_attn.num_heads,
                                                   "ffn_hidden": l.ffn.hidden, "activation": l.ffn.kind,
                                                   "max_len": l.self_attn.max_len,
                                                   "use_bias": bool(l.self_attn.use_bias)},
                                                  l, (("dropout", 0.0),))),
    "Transformer": (Transformer, lambda l: _opt({"src_vocab": l.src_vocab, "tgt_vocab": l.tgt_vocab,
                                                 "embed_dim": l.embed_dim, "num_heads": l.num_heads,
                                                 "ffn_hidden": l.ffn_hidden,
                                                 "num_encoder_layers": len(l.encoder),
                                                 "num_decoder_layers": len(l.decoder), "max_len": l.max_len,
                                                 "activation": l.activation, "use_bias": bool(l.use_bias)},
                                                l, (("dropout", 0.0),))),
    "Conv1D": (Conv1D, lambda l: {"in_channels": l.in_channels, "out_channels": l.out_channels,
                                  "kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding,
                                  "dilation": l.dilation, "groups": l.groups, "use_bias": bool(l.use_bias)}),
    "MaxPool1D": (MaxPool1D, lambda l: {"kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding}),
    "AvgPool1D": (AvgPool1D, lambda l: {"kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding}),
    "LearnedPositionalEmbedding": (LearnedPositionalEmbedding,
                                   lambda l: {"max_len": l.max_len, "embed_dim": l.embed_dim}),
}

FORMAT = "microformer-spec/1"


def _layer_spec(layer, where):
    name = type(layer).__name__
    if isinstance(layer, Sequential):
        return {"type": "Sequential",
                "layers": [_layer_spec(layer.layers[i], "%s[%d]" % (where, i)) for i in range(len(layer.layers))]}
    if name not in _LAYERS or not isinstance(layer, _LAYERS[name][0]):
        raise ValueError("to_spec: %s is a %s, which a spec cannot describe (known: %s)"
                         % (where, name, ", ".join(sorted(_LAYERS))))
    out = {"type": name}
    out.update(_LAYERS[name][1](layer))
    return out


def to_spec(model):
    """The model's layers and their constructor arguments, as a JSON-able dict."""
    spec = _layer_spec(model, "model")
    spec["format"] = FORMAT
    return spec


def _build(spec, where):
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError("from_spec: %s must be a dict with a 'type', got %r" % (where, spec))
    kind = spec["type"]
    if kind == "Sequential":
        layers = spec.get("layers")
        if not isinstance(layers, list):
            raise ValueError("from_spec: %s (Sequential) needs a 'layers' list, got %r" % (where, layers))
        return Sequential([_build(layers[i], "%s.layers[%d]" % (where, i)) for i in range(len(layers))])
    if kind not in _LAYERS:
        raise ValueError("from_spec: %s: unknown layer type %r (known: Sequential, %s)"
                         % (where, kind, ", ".join(sorted(_LAYERS))))
    kwargs = {}
    for k in spec:
        if k != "type" and k != "format":
            kwargs[k] = spec[k]
    if kind == "Reshape" and isinstance(kwargs.get("shape"), list):
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return _LAYERS[kind][0](**kwargs)
    except TypeError as e:
        raise ValueError("from_spec: %s (%s): bad arguments %r (%s)" % (where, kind, kwargs, e))


def from_spec(spec):
    """A freshly initialised model from to_spec()'s dict (seed with mf.seed first to repeat it)."""
    if isinstance(spec, dict) and "format" in spec and spec["format"] != FORMAT:
        raise ValueError("from_spec: format %r, expected %r" % (spec["format"], FORMAT))
    return _build(spec, "spec")


def same_architecture(a, b):
    """True when two specs describe the same layers with the same arguments."""
    def strip(s):
        if isinstance(s, dict):
            return {k: strip(v) for k, v in s.items() if k != "format"}
        if isinstance(s, (list, tuple)):
            return [strip(v) for v in s]
        return s
    return strip(a) == strip(b)


def load_model(path, with_meta=False):
    """The model a checkpoint describes (its spec), with the checkpoint's weights; verified
    before any weight is used. with_meta=True returns (model, meta)."""
    from . import checkpoint
    head = checkpoint.read_header(path)
    spec = head["meta"].get("spec")
    if spec is None:
        raise checkpoint.CheckpointError("checkpoint %r: its metadata holds no model spec (it was saved "
                                         "without one); build the model in code and use load_checkpoint"
                                         % (path,))
    model = from_spec(spec)
    checkpoint.load(path, model)
    return (model, head["meta"]) if with_meta else model
