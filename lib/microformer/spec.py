# microformer.spec: a model as plain data, and back.
#   to_spec(model) -> {"type": "Sequential", "layers": [{"type": "Dense", "in_features": 4, ...}, ...]}
#   from_spec(spec) -> the model (freshly initialised; a checkpoint fills in the weights)
# A spec is JSON-able: checkpoints carry it, so load_model(path) rebuilds a model with no code.
import sys

from .model import Sequential

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
           'PositionalEncoding': 'posenc',
           'Reshape': 'reshape',
           'Sequential': 'model',
           'Transformer': 'decoder'}


def _cls(name):
    mod = "microformer." + _MODULE[name]
    __import__(mod)
    return getattr(sys.modules[mod], name)



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
                                                  l, (("dropout", 0.0), ("kv_tile", None)))),
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
}

FORMAT = "microformer-spec/1"


def _layer_spec(layer, where):
    name = type(layer).__name__
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
    """The model's layers and their constructor arguments, as a JSON-able dict."""
    spec = _layer_spec(model, "model")
    spec["format"] = FORMAT
    return spec


# ---- what a spec costs, known before anything is built ---------------------------------------
# A checkpoint's spec is data from a file: a forged 200-byte file may say Dense(8192, 8192) or
# Transformer(num_encoder_layers=10**6). plan() reads off the parameters (name, shape) a spec's
# layers would create, and the floats of the fixed tables they fill (PositionalEncoding), from the
# constructor arguments alone; check_tensors compares them with a file's tensor table before any
# layer is built. The table below restates, per layer, what its constructor allocates:
# test_checkpoint_forged.py builds every layer type and compares, so a change there fails a test.

MAX_PARAMS = 1 << 24    # floats a spec may make the constructors allocate (parameters + fixed
#                         tables): 64 MB of float32, 8x the PSRAM of an ESP32-S3 board
MAX_DEPTH = 8           # Sequentials nested in Sequentials


def _p_dense(a):
    o, i = a["out_features"], a["in_features"]
    return [("W", (o, i))] + ([("b", (o,))] if a["use_bias"] else [])


def _p_attention(a, E=None, bias=None):
    E = a["embed_dim"] if E is None else E
    bias = a["use_bias"] if bias is None else bias
    out = []
    for n in "qkvo":
        out.append(("W" + n, (E, E)))
        if bias:
            out.append(("b" + n, (E,)))
    return out


def _p_norm(d):
    return [("gamma", (d,)), ("beta", (d,))]


def _p_ffn(E, H, bias):
    out = [("W1", (H, E))] + ([("b1", (H,))] if bias else [])
    return out + [("W2", (E, H))] + ([("b2", (E,))] if bias else [])


def _pre(prefix, named):
    return [(prefix + n, s) for n, s in named]


def _p_block(a, cross):
    E, H, bias = a["embed_dim"], a["ffn_hidden"], a["use_bias"]
    att = _p_attention(a, E, bias)
    if cross:           # DecoderBlock
        return (_pre("ln1.", _p_norm(E)) + _pre("self_attn.", att) + _pre("ln2.", _p_norm(E))
                + _pre("cross_attn.", att) + _pre("ln3.", _p_norm(E)) + _pre("ffn.", _p_ffn(E, H, bias)))
    return (_pre("ln1.", _p_norm(E)) + _pre("attn.", att) + _pre("ln2.", _p_norm(E))
            + _pre("ffn.", _p_ffn(E, H, bias)))


def _tf_parts(a, n_enc, n_dec):
    # Transformer._parts(): (prefix, that part's parameters)
    E, bias = a["embed_dim"], a["use_bias"]
    enc, dec = _p_block(a, False), _p_block(a, True)
    out = [("src_embed.", [("W", (a["src_vocab"], E))])]
    out += [("encoder.layers.%d." % i, enc) for i in range(n_enc)]
    out += [("encoder.norm.", _p_norm(E)), ("tgt_embed.", [("W", (a["tgt_vocab"], E))])]
    out += [("decoder.layers.%d." % i, dec) for i in range(n_dec)]
    out += [("decoder.norm.", _p_norm(E)),
            ("generator.", _p_dense({"in_features": E, "out_features": a["tgt_vocab"], "use_bias": bias}))]
    return out


def _p_tf(a):
    out = []
    for _, named in _tf_parts(a, a["num_encoder_layers"], a["num_decoder_layers"]):
        out += named            # params() names: without the part prefixes
    return out


def _count_tf(a):
    # the count without listing 10**6 blocks: one of each, times how many
    n = _floats(_p_tf(dict(a, num_encoder_layers=1, num_decoder_layers=1)))
    return n + (a["num_encoder_layers"] - 1) * _floats(_p_block(a, False)) + \
        (a["num_decoder_layers"] - 1) * _floats(_p_block(a, True))


def _p_conv(a):
    o = a["out_channels"]
    W = ("W", (o, a["in_channels"] // a["groups"], a["kernel_size"]))
    return [W] + ([("b", (o,))] if a["use_bias"] else [])


def _none(a):
    return []


# type: (constructor arguments in order (a legacy layer list gives them by position), the
# shape arguments: (name, default or _REQ, least value), parameters from them, fixed-table floats)
_REQ = "required"
_PLAN = {
    "Dense": (("in_features", "out_features", "use_bias", "rng"),
              (("in_features", _REQ, 1), ("out_features", _REQ, 1), ("use_bias", True, None)), _p_dense, None),
    "Attention": (("embed_dim", "num_heads", "use_bias", "causal", "rng", "max_len", "dropout", "kv_tile"),
                  (("embed_dim", _REQ, 1), ("num_heads", _REQ, 1), ("use_bias", True, None)), _p_attention, None),
    "ActivationLayer": (("kind",), (), _none, None),
    "Reshape": (("shape",), (), _none, None),
    "GlobalAvgPool": ((), (), _none, None),
    "LayerNorm": (("dim", "eps"), (("dim", _REQ, 1),), lambda a: _p_norm(a["dim"]), None),
    "FeedForward": (("embed_dim", "hidden", "activation", "use_bias", "rng", "dropout"),
                    (("embed_dim", _REQ, 1), ("hidden", _REQ, 1), ("use_bias", True, None)),
                    lambda a: _p_ffn(a["embed_dim"], a["hidden"], a["use_bias"]), None),
    "Embedding": (("vocab", "embed_dim", "rng"), (("vocab", _REQ, 1), ("embed_dim", _REQ, 1)),
                  lambda a: [("W", (a["vocab"], a["embed_dim"]))], None),
    "PositionalEncoding": (("max_len", "embed_dim", "dropout"), (("max_len", _REQ, 1), ("embed_dim", _REQ, 1)),
                           _none, lambda a: a["max_len"] * a["embed_dim"]),
    "EncoderBlock": (("embed_dim", "num_heads", "ffn_hidden", "causal", "activation", "max_len", "use_bias",
                      "rng", "dropout", "kv_tile"),
                     (("embed_dim", _REQ, 1), ("num_heads", _REQ, 1), ("ffn_hidden", _REQ, 1),
                      ("use_bias", True, None)), lambda a: _p_block(a, False), None),
    "Dropout": (("p", "seed"), (), _none, None),
    "DecoderBlock": (("embed_dim", "num_heads", "ffn_hidden", "activation", "max_len", "use_bias", "rng",
                      "dropout"),
                     (("embed_dim", _REQ, 1), ("num_heads", _REQ, 1), ("ffn_hidden", _REQ, 1),
                      ("use_bias", True, None)), lambda a: _p_block(a, True), None),
    "Transformer": (("src_vocab", "tgt_vocab", "embed_dim", "num_heads", "ffn_hidden", "num_encoder_layers",
                     "num_decoder_layers", "max_len", "activation", "use_bias", "rng", "dropout"),
                    (("src_vocab", _REQ, 1), ("tgt_vocab", _REQ, 1), ("embed_dim", _REQ, 1),
                     ("num_heads", _REQ, 1), ("ffn_hidden", _REQ, 1), ("num_encoder_layers", 1, 1),
                     ("num_decoder_layers", 1, 1), ("max_len", 64, 1), ("use_bias", True, None)),
                    _p_tf, lambda a: 2 * a["max_len"] * a["embed_dim"]),
    "Conv1D": (("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                "use_bias", "rng"),
               (("in_channels", _REQ, 1), ("out_channels", _REQ, 1), ("kernel_size", _REQ, 1),
                ("groups", 1, 1), ("use_bias", True, None)), _p_conv, None),
    "MaxPool1D": (("kernel_size", "stride", "padding"), (), _none, None),
    "AvgPool1D": (("kernel_size", "stride", "padding"), (), _none, None),
    "LearnedPositionalEmbedding": (("max_len", "embed_dim", "rng"), (("max_len", _REQ, 1), ("embed_dim", _REQ, 1)),
                                   lambda a: [("W", (a["max_len"], a["embed_dim"]))], None),
}


def _floats(named):
    n = 0
    for _, shape in named:
        k = 1
        for d in shape:
            k *= d
        n += k
    return n


def _args(spec, kind, where):
    # the shape arguments of one layer's spec, defaults filled in; ValueError naming a bad one
    if "rng" in spec:
        raise ValueError("%s (%s): 'rng' is not a spec argument (mf.seed sets the initial weights), got %r"
                         % (where, kind, spec["rng"]))
    a = {}
    for name, default, least in _PLAN[kind][1]:
        if name not in spec:
            if default is _REQ:
                raise ValueError("%s (%s): missing argument %r" % (where, kind, name))
            a[name] = default
            continue
        v = spec[name]
        if least is None:
            if not isinstance(v, bool):
                raise ValueError("%s (%s): %s must be true or false, got %r" % (where, kind, name, v))
        elif isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError("%s (%s): %s must be an int >= %d, got %r" % (where, kind, name, least, v))
        elif v > MAX_PARAMS:
            raise ValueError("%s (%s): %s = %d is more than the limit MAX_PARAMS = %d"
                             % (where, kind, name, v, MAX_PARAMS))
        a[name] = v
    if kind == "Conv1D" and (a["in_channels"] % a["groups"] or a["out_channels"] % a["groups"]):
        raise ValueError("%s (Conv1D): groups=%d must divide in_channels=%d and out_channels=%d"
                         % (where, a["groups"], a["in_channels"], a["out_channels"]))
    return a


def _walk(spec, where, depth, out):
    # checks types, nesting and shape arguments; out[0] += parameters, out[1] += table floats,
    # stopping at the first layer past MAX_PARAMS (so 10**6 layers cost one step past the limit)
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError("%s must be a dict with a 'type', got %s" % (where, _short(spec)))
    kind = spec["type"]
    if kind == "Sequential":
        layers = spec.get("layers")
        if not isinstance(layers, list):
            raise ValueError("%s (Sequential) needs a 'layers' list, got %s" % (where, _short(layers)))
        if depth >= MAX_DEPTH:
            raise ValueError("%s: Sequentials nested more than MAX_DEPTH = %d deep" % (where, MAX_DEPTH))
        for i in range(len(layers)):
            _walk(layers[i], "%s.layers[%d]" % (where, i), depth + 1, out)
        return
    if kind not in _PLAN:
        raise ValueError("%s: unknown layer type %r (known: Sequential, %s)"
                         % (where, kind, ", ".join(sorted(_PLAN))))
    a = _args(spec, kind, where)
    out[0] += _count_tf(a) if kind == "Transformer" else _floats(_PLAN[kind][2](a))
    tables = _PLAN[kind][3]
    if tables is not None:
        out[1] += tables(a)
    if out[0] + out[1] > MAX_PARAMS:
        raise ValueError("%s (%s): the spec declares at least %d parameters and %d floats of fixed tables "
                         "up to here, more than the limit MAX_PARAMS = %d"
                         % (where, kind, out[0], out[1], MAX_PARAMS))


def _short(v):
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def plan(spec):
    """(parameters, fixed-table floats) the model of `spec` would allocate, read off the spec
    alone; ValueError naming the layer when the spec is malformed or exceeds MAX_PARAMS."""
    if isinstance(spec, dict) and "format" in spec and spec["format"] != FORMAT:
        raise ValueError("spec: format %r, expected %r" % (spec["format"], FORMAT))
    out = [0, 0]
    _walk(spec, "spec", 0, out)
    return out[0], out[1]


def _raw(spec):
    # what model.params() names, in order (a Sequential inside a Sequential: its layers' names)
    kind = spec["type"]
    if kind == "Sequential":
        out = []
        for l in spec["layers"]:
            out += _raw(l)
        return out
    return _PLAN[kind][2](_args(spec, kind, "spec"))


def named_shapes(spec):
    """[(name, shape)] of the model spec describes, as checkpoint.save names them; call plan()
    first (it bounds the sizes)."""
    kind = spec["type"]
    if kind == "Sequential":
        out = []
        layers = spec["layers"]
        for i in range(len(layers)):
            out += _pre("%d." % i, _raw(layers[i]))
        return out
    if kind == "Transformer":
        a = _args(spec, kind, "spec")
        out = []
        for prefix, named in _tf_parts(a, a["num_encoder_layers"], a["num_decoder_layers"]):
            out += _pre(prefix, named)
        return out
    return _raw(spec)


def check_tensors(spec, tensors, where):
    """CheckpointError, naming `where` and what differs, unless `spec` is well formed, within
    MAX_PARAMS, and declares exactly the tensors [(name, shape)] of a file's table. Reads the
    spec only: nothing is built."""
    from .checkpoint import CheckpointError
    try:
        params, tables = plan(spec)
    except ValueError as e:
        raise CheckpointError("%s: bad model spec: %s" % (where, e))
    have = 0
    for _, shape in tensors:
        k = 1
        for d in shape:
            k *= d
        have += k
    if params != have:
        raise CheckpointError("%s: the spec declares %d parameters (%d bytes), the file's tensors hold %d "
                              "(%d bytes)" % (where, params, 4 * params, have, 4 * have))
    mine = named_shapes(spec)
    table = {}
    for name, shape in tensors:
        table[name] = tuple(shape)
    for name, shape in mine:
        if name not in table:
            raise CheckpointError("%s: the spec declares tensor %r %r, the file has no tensor of that name"
                                  % (where, name, shape))
        if table[name] != tuple(shape):
            raise CheckpointError("%s: tensor %r: the spec declares shape %r, the file holds %r"
                                  % (where, name, tuple(shape), table[name]))
    if len(mine) != len(tensors):
        names = {}
        for name, _ in mine:
            names[name] = 1
        for name, shape in tensors:
            if name not in names:
                raise CheckpointError("%s: the file holds tensor %r %r, which the spec does not declare"
                                      % (where, name, tuple(shape)))
        raise CheckpointError("%s: the spec declares %d tensors, the file holds %d"
                              % (where, len(mine), len(tensors)))


def _build(spec, where):
    # after plan(spec): the types, nesting and sizes are known to be sound
    kind = spec["type"]
    if kind == "Sequential":
        layers = spec["layers"]
        return Sequential([_build(layers[i], "%s.layers[%d]" % (where, i)) for i in range(len(layers))])
    kwargs = {}
    for k in spec:
        if k != "type" and k != "format":
            kwargs[k] = spec[k]
    if kind == "Reshape" and isinstance(kwargs.get("shape"), list):
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return _cls(kind)(**kwargs)
    except TypeError as e:          # an argument the constructor does not take
        raise ValueError("from_spec: %s (%s): bad arguments %r (%s)" % (where, kind, kwargs, e))


def from_spec(spec):
    """A freshly initialised model from to_spec()'s dict (seed with mf.seed first to repeat it).
    ValueError before anything is built when the spec is malformed or declares more than
    MAX_PARAMS floats (see plan)."""
    try:
        plan(spec)
    except ValueError as e:
        raise ValueError("from_spec: %s" % e)
    return _build(spec, "spec")


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


def _from_layer_list(layers, where):
    # the layer list older checkpoints carry in meta['layers']: [class name, *args] (a trailing
    # dict: kwargs), e.g. [["Dense", 4, 32], ["ActivationLayer", "relu"], ...]: the spec it
    # means, the positions named by the constructors' argument order (nothing is built)
    if not isinstance(layers, list):
        raise ValueError("%s: meta['layers'] must be a list, got %s" % (where, _short(layers)))
    out = []
    for i in range(len(layers)):
        one = layers[i]
        if not isinstance(one, list) or not one or not isinstance(one[0], str) or one[0] not in _LAYERS:
            raise ValueError("%s: meta['layers'][%d] must be [layer name, *args] with a name from %s, "
                             "got %s" % (where, i, ", ".join(sorted(_LAYERS)), _short(one)))
        args = list(one[1:])
        kw = args.pop() if args and isinstance(args[-1], dict) else {}
        names = _PLAN[one[0]][0]
        if len(args) > len(names):
            raise ValueError("%s: meta['layers'][%d] %s: %s takes at most %d arguments, got %d"
                             % (where, i, _short(one), one[0], len(names), len(args)))
        spec = {"type": one[0]}
        for j in range(len(args)):
            if names[j] in kw:
                raise ValueError("%s: meta['layers'][%d] %s: %r given twice" % (where, i, _short(one), names[j]))
            if names[j] != "rng" or args[j] is not None:
                spec[names[j]] = args[j]
        for k in kw:
            spec[k] = kw[k]
        out.append(spec)
    return {"type": "Sequential", "layers": out, "format": FORMAT}


def find_spec(meta, where="checkpoint"):
    """The model spec a checkpoint's metadata describes, or None when it holds none: meta['spec'];
    for checkpoints written before specs, meta['layers'] (a layer list) or meta['arch']
    'iris-attention-v1' (the seed's Iris model). CheckpointError naming `where` when meta is
    not a dict or its layer list is malformed."""
    from .checkpoint import CheckpointError
    if not isinstance(meta, dict):
        raise CheckpointError("%s: metadata must be a JSON object, got %s" % (where, _short(meta)))
    if "spec" in meta:
        return meta["spec"]
    if "layers" in meta:
        try:
            return _from_layer_list(meta["layers"], where)
        except ValueError as e:
            raise CheckpointError(str(e))
    from .models import IRIS_ARCH, IRIS_SPEC
    if meta.get("arch") == IRIS_ARCH:
        return IRIS_SPEC
    return None


def spec_of(meta, where="checkpoint"):
    """find_spec(meta, where), and CheckpointError when the metadata holds no spec."""
    from .checkpoint import CheckpointError
    spec = find_spec(meta, where)
    if spec is None:
        raise CheckpointError("%s: its metadata holds no model spec (meta['spec']; it was saved from a "
                              "model with a layer a spec cannot describe, or with spec=False): build the "
                              "model in code and use load_checkpoint" % where)
    return spec


def load_model(path, with_meta=False):
    """The model a checkpoint describes (its spec), with the checkpoint's weights. Before any
    layer is built, read_header has verified the file and compared its spec with its tensor
    table (names, shapes, sizes, MAX_PARAMS); every refusal is a CheckpointError naming the
    file. with_meta=True returns (model, meta). Checkpoints written before specs load too (see
    find_spec)."""
    from . import checkpoint
    path = checkpoint._fspath(path, "load_model")
    where = "checkpoint %r" % (path,)
    head = checkpoint.read_header(path)
    spec = spec_of(head["meta"], where)
    try:
        model = from_spec(spec)
    except ValueError as e:             # an argument the layer refuses (type, value, unknown name)
        raise checkpoint.CheckpointError("%s: %s" % (where, e))
    checkpoint.load(path, model)
    return (model, head["meta"]) if with_meta else model
