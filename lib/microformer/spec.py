# microformer.spec: a model as plain data, and back.
#   to_spec(model) -> {"type": "Sequential", "layers": [{"type": "Dense", "in_features": 4, ...}, ...]}
#   from_spec(spec) -> the model (freshly initialised; a checkpoint fills in the weights)
# A spec is JSON-able: checkpoints carry it, so load_model(path) (microformer.checkpoint) rebuilds a
# model with no code. What a spec costs is read off it, before anything is built, by specplan;
# its format name and limits are specformat's.
import sys

from .lazy import sibling
from .model import Sequential
from .specformat import FORMAT, MAX_DEPTH, _short

# the module each layer class lives in: imported when a spec needs it (a board without PSRAM
# has a small heap; `import microformer` leaves the rarer layers out until they are used)
_MODULE = {'ActivationLayer': 'activation',
           'Attention': 'attention',
           'AvgPool1D': 'pool1d',
           'Conv1D': 'conv',
           'DecoderBlock': 'decoder',
           'Dense': 'dense',
           'Dropout': 'dropout',
           'Embedding': 'embedding',
           'EncoderBlock': 'block',
           'FeedForward': 'feedforward',
           'GlobalAvgPool': 'pool',
           'LayerNorm': 'norm',
           'LearnedPositionalEmbedding': 'posembed',
           'MaxPool1D': 'pool1d',
           'NamedSequential': 'graph',
           'PositionTable': 'graph',
           'PrependToken': 'graph',
           'Residual': 'graph',
           'SelectPosition': 'graph',
           'SeqReduce': 'graph',
           'PositionalEncoding': 'posenc',
           'Reshape': 'reshape',
           'Sequential': 'model',
           'Transformer': 'decoder'}


def _cls(name):
    return getattr(sibling(_MODULE[name]), name)



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
    "Dense": ("dense", lambda l: {"in_features": l.in_features, "out_features": l.out_features,
                                "use_bias": bool(l.use_bias)}),
    "Attention": ("attention", lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.num_heads,
                                        "use_bias": bool(l.use_bias), "causal": l.causal,
                                        "max_len": l.max_len}, l, (("dropout", 0.0), ("kv_tile", None)))),
    "ActivationLayer": ("activation", lambda l: {"kind": l.kind}),
    "Reshape": ("reshape", lambda l: {"shape": list(l.shape)}),
    "GlobalAvgPool": ("pool", lambda l: {}),
    "LayerNorm": ("norm", lambda l: {"dim": l.dim, "eps": l.eps}),
    "FeedForward": ("feedforward", lambda l: _opt({"embed_dim": l.embed_dim, "hidden": l.hidden,
                                                 "activation": l.kind, "use_bias": bool(l.fc1.use_bias)},
                                                l, (("dropout", 0.0),))),
    "Embedding": ("embedding", lambda l: {"vocab": l.vocab, "embed_dim": l.embed_dim}),
    "PositionalEncoding": ("posenc", lambda l: _opt({"max_len": l.max_len, "embed_dim": l.embed_dim},
                                                              l, (("dropout", 0.0),))),
    "EncoderBlock": ("block", lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.attn.num_heads,
                                                   "ffn_hidden": l.ffn.hidden, "causal": l.causal,
                                                   "activation": l.ffn.kind, "max_len": l.attn.max_len,
                                                   "use_bias": bool(l.attn.use_bias)},
                                                  l, (("dropout", 0.0), ("kv_tile", None),
                                                      ("norm_first", True)))),
    "Dropout": ("dropout", lambda l: {"p": l.p}),
    "DecoderBlock": ("decoder", lambda l: _opt({"embed_dim": l.embed_dim, "num_heads": l.self_attn.num_heads,
                                                   "ffn_hidden": l.ffn.hidden, "activation": l.ffn.kind,
                                                   "max_len": l.self_attn.max_len,
                                                   "use_bias": bool(l.self_attn.use_bias)},
                                                  l, (("dropout", 0.0),))),
    "Transformer": ("decoder", lambda l: _opt({"src_vocab": l.src_vocab, "tgt_vocab": l.tgt_vocab,
                                                 "embed_dim": l.embed_dim, "num_heads": l.num_heads,
                                                 "ffn_hidden": l.ffn_hidden,
                                                 "num_encoder_layers": len(l.encoder),
                                                 "num_decoder_layers": len(l.decoder), "max_len": l.max_len,
                                                 "activation": l.activation, "use_bias": bool(l.use_bias)},
                                                l, (("dropout", 0.0),))),
    "Conv1D": ("conv", lambda l: {"in_channels": l.in_channels, "out_channels": l.out_channels,
                                  "kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding,
                                  "dilation": l.dilation, "groups": l.groups, "use_bias": bool(l.use_bias)}),
    "MaxPool1D": ("pool1d", lambda l: {"kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding}),
    "AvgPool1D": ("pool1d", lambda l: {"kernel_size": l.kernel_size, "stride": l.stride, "padding": l.padding}),
    "LearnedPositionalEmbedding": ("posembed",
                                   lambda l: {"max_len": l.max_len, "embed_dim": l.embed_dim}),
    "SelectPosition": ("graph", lambda l: {"index": l.index}),
    "PrependToken": ("graph", lambda l: {"embed_dim": l.embed_dim}),
    "SeqReduce": ("graph", lambda l: {"kind": l.kind}),
    "PositionTable": ("graph", lambda l: {"max_len": l.max_len, "embed_dim": l.embed_dim}),
}

# containers besides Sequential (graph.py): their parts are specs themselves
_CONTAINERS = ("NamedSequential", "Residual")


def _layer_spec(layer, where):
    name = type(layer).__name__
    if name in _CONTAINERS and isinstance(layer, _cls(name)):
        if name == "Residual":
            return {"type": name, "inner": _layer_spec(layer.inner, where + ".inner")}
        return {"type": name, "names": list(layer.names),
                "layers": [_layer_spec(layer.layers[i], "%s[%d]" % (where, i)) for i in range(len(layer.layers))]}
    if isinstance(layer, Sequential):
        return {"type": "Sequential",
                "layers": [_layer_spec(layer.layers[i], "%s[%d]" % (where, i)) for i in range(len(layer.layers))]}
    if name not in _LAYERS or not isinstance(layer, _cls(name)):
        raise ValueError("to_spec: %s is a %s, which a spec cannot describe (known: %s)"
                         % (where, name, ", ".join(sorted(_LAYERS))))
    out = {"type": name}
    out.update(_LAYERS[name][1](layer))
    return out


def to_spec(model):
    """The model's layers and their constructor arguments, as a JSON-able dict; a model with LoRA
    adapters (mf.add_lora) also gets spec['lora'] = [{"rank", "alpha", "targets": [linear names]}]."""
    spec = _layer_spec(model, "model")
    if "microformer.lora" in sys.modules:       # no adapter exists before lora is imported
        groups = sys.modules["microformer.lora"].spec_groups(model)
        if groups:
            spec["lora"] = groups
    spec["format"] = FORMAT
    return spec


def _build(spec, where, depth):
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError("from_spec: %s must be a dict with a 'type', got %s" % (where, _short(spec)))
    kind = spec["type"]
    if kind == "Sequential":
        layers = spec.get("layers")
        if not isinstance(layers, list):
            raise ValueError("from_spec: %s (Sequential) needs a 'layers' list, got %s" % (where, _short(layers)))
        if depth >= MAX_DEPTH:
            raise ValueError("from_spec: %s: Sequentials nested more than MAX_DEPTH = %d deep" % (where, MAX_DEPTH))
        return Sequential([_build(layers[i], "%s.layers[%d]" % (where, i), depth + 1) for i in range(len(layers))])
    if kind in _CONTAINERS:
        return _container(spec, kind, where, depth)
    if kind not in _LAYERS:
        raise ValueError("from_spec: %s: unknown layer type %r (known: Sequential, %s)"
                         % (where, kind, ", ".join(sorted(_LAYERS))))
    kwargs = {}
    for k in spec:
        if k != "type" and k != "format" and not (depth == 0 and k == "lora"):
            kwargs[k] = spec[k]
    if kind == "Reshape" and isinstance(kwargs.get("shape"), list):
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return _cls(kind)(**kwargs)
    except TypeError as e:          # an argument the constructor does not take
        raise ValueError("from_spec: %s (%s): bad arguments %r (%s)" % (where, kind, kwargs, e))


def _container(spec, kind, where, depth):
    # NamedSequential {names, layers} and Residual {inner} (graph.py), nested within MAX_DEPTH
    if depth >= MAX_DEPTH:
        raise ValueError("from_spec: %s: containers nested more than MAX_DEPTH = %d deep" % (where, MAX_DEPTH))
    extra = [k for k in spec if k not in ("type", "format", "lora", "names", "layers", "inner")]
    if extra:
        raise ValueError("from_spec: %s (%s): unknown keys %r" % (where, kind, sorted(extra)))
    if kind == "Residual":
        return _cls(kind)(_build(spec.get("inner"), where + ".inner", depth + 1))
    layers = spec.get("layers")
    names = spec.get("names")
    if not isinstance(layers, list) or not isinstance(names, list) or len(names) != len(layers) or \
            not all(isinstance(n, str) for n in names):
        raise ValueError("from_spec: %s (NamedSequential) needs 'layers' and as many 'names' (strings), got %s, %s"
                         % (where, _short(layers), _short(names)))
    return _cls(kind)([_build(layers[i], "%s.layers[%d]" % (where, i), depth + 1) for i in range(len(layers))],
                      names)


def from_spec(spec):
    """A freshly initialised model from to_spec()'s dict (seed with mf.seed first to repeat it).
    It builds what the spec says: a spec from a file is checked first (checkpoint.read_header,
    checkpoint.load_model; specplan.plan(spec) gives the sizes of any spec without building it)."""
    if isinstance(spec, dict) and "format" in spec and spec["format"] != FORMAT:
        raise ValueError("from_spec: format %r, expected %r" % (spec["format"], FORMAT))
    if isinstance(spec, dict) and "lora" in spec:
        from .specplan import lora_tensors
        lora_tensors(spec, None, [0, 0])        # the adapters name linear maps of this spec
    model = _build(spec, "spec", 0)
    if isinstance(spec, dict) and "lora" in spec:
        from .lora import add_lora
        for g in spec["lora"]:                  # frozen base, trainable adapters, as add_lora leaves them
            add_lora(model, g["rank"], g["alpha"], g["targets"])
    return model


def difference(a, b, names=("the checkpoint", "the model")):
    """None when specs a and b describe the same layers with the same arguments (floats within
    1e-6 relative, for a single-precision board), else where they first differ, e.g.
    "layers[0].out_features: 64 in the checkpoint, 32 in the model"."""
    return _diff(a, b, "spec", names)


def _diff(a, b, where, names):
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted([k for k in a if k != "format"] + [k for k in b if k != "format" and k not in a])
        for k in keys:
            if k not in a or k not in b:
                return "%s.%s: only in %s" % (where, k, names[1] if k not in a else names[0])
            d = _diff(a[k], b[k], where + "." + k, names)
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return "%s: %d entries in %s, %d in %s" % (where, len(a), names[0], len(b), names[1])
        for i in range(len(a)):
            d = _diff(a[i], b[i], "%s[%d]" % (where, i), names)
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool) or \
            isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        same = abs(a - b) <= 1e-6 * max(abs(a), abs(b))
    else:
        same = a == b and (type(a) is bool) == (type(b) is bool)
    if not same:
        return "%s: %r in %s, %r in %s" % (where, a, names[0], b, names[1])
    return None


def same_architecture(a, b):
    """True when two specs describe the same layers with the same arguments (see difference)."""
    return _diff(a, b, "spec", ("a", "b")) is None
