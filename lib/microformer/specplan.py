# microformer.specplan: what a model spec would allocate, read off its arguments, and the check
# of a checkpoint's spec against its tensor table; nothing is built (checkpoint.py imports it,
# and spec.py for a spec with adapters; it imports neither).
#
# Per layer type: (its shape arguments, "name" or "name=default", all ints >= 1, read by
# position below; its parameters; its constructor's arguments in order, for old layer lists).
# A parameter is "name:dims", dims being argument positions ("0/3": argument 0 // argument 3);
# "name?" exists only with use_bias (default true); "~:dims" is a fixed table (not saved);
# "prefix>Type:dims" is a part whose parameter names get the prefix, "prefix^Type:dims" one
# whose prefix only the whole model's names carry (Transformer.named_params), "#" in a prefix
# the part's index and "*k" repeats it argument k times. test_checkpoint_forged.py builds every
# layer type and compares, so a change in a layer fails a test until this table follows it.
from .specformat import FORMAT, MAX_DEPTH, MAX_PARAMS, _short
from .tensor import shape_size


_ATT = "Wq:0,0 bq?:0 Wk:0,0 bk?:0 Wv:0,0 bv?:0 Wo:0,0 bo?:0"
_P = {
    "Dense": ("in_features out_features", "W:1,0 b?:1", "in_features out_features use_bias rng"),
    "Attention": ("embed_dim num_heads", _ATT,
                  "embed_dim num_heads use_bias causal rng max_len dropout kv_tile"),
    "ActivationLayer": ("", "", "kind"),
    "Reshape": ("", "", "shape"),
    "GlobalAvgPool": ("", "", ""),
    "LayerNorm": ("dim", "gamma:0 beta:0", "dim eps"),
    "FeedForward": ("embed_dim hidden", "W1:1,0 b1?:1 W2:0,1 b2?:0",
                    "embed_dim hidden activation use_bias rng dropout"),
    "Embedding": ("vocab embed_dim", "W:0,1", "vocab embed_dim rng"),
    "PositionalEncoding": ("max_len embed_dim", "~:0,1", "max_len embed_dim dropout"),
    "EncoderBlock": ("embed_dim num_heads ffn_hidden",
                     "ln1.>LayerNorm:0 attn.>Attention:0,1 ln2.>LayerNorm:0 ffn.>FeedForward:0,2",
                     "embed_dim num_heads ffn_hidden causal activation max_len use_bias rng dropout kv_tile"),
    "Dropout": ("", "", "p seed"),
    "DecoderBlock": ("embed_dim num_heads ffn_hidden",
                     "ln1.>LayerNorm:0 self_attn.>Attention:0,1 ln2.>LayerNorm:0 cross_attn.>Attention:0,1 "
                     "ln3.>LayerNorm:0 ffn.>FeedForward:0,2",
                     "embed_dim num_heads ffn_hidden activation max_len use_bias rng dropout"),
    "Transformer": ("src_vocab tgt_vocab embed_dim num_heads ffn_hidden num_encoder_layers=1 "
                    "num_decoder_layers=1 max_len=64",
                    "src_embed.^Embedding:0,2 encoder.layers.#.^EncoderBlock:2,3,4*5 encoder.norm.^LayerNorm:2 "
                    "tgt_embed.^Embedding:1,2 decoder.layers.#.^DecoderBlock:2,3,4*6 decoder.norm.^LayerNorm:2 "
                    "generator.^Dense:2,1 ~:7,2 ~:7,2",
                    "src_vocab tgt_vocab embed_dim num_heads ffn_hidden num_encoder_layers num_decoder_layers "
                    "max_len activation use_bias rng dropout"),
    "Conv1D": ("in_channels out_channels kernel_size groups=1", "W:1,0/3,2 b?:1",
               "in_channels out_channels kernel_size stride padding dilation groups use_bias rng"),
    "MaxPool1D": ("", "", "kernel_size stride padding"),
    "AvgPool1D": ("", "", "kernel_size stride padding"),
    "LearnedPositionalEmbedding": ("max_len embed_dim", "W:0,1", "max_len embed_dim rng"),
    # graph.py; "=1" is a literal dimension, an empty name the container's prefix alone
    "SelectPosition": ("", "", "index"),
    "SeqReduce": ("", "", "kind"),
    "PrependToken": ("embed_dim", ":=1,=1,0", "embed_dim"),
    "PositionTable": ("max_len embed_dim", ":=1,0,1", "max_len embed_dim"),
}


def _args(spec, kind, where):
    # the shape arguments of one layer's spec (defaults filled in) and use_bias
    if "rng" in spec:
        raise ValueError("%s (%s): 'rng' is not a spec argument (mf.seed sets the initial weights), got %r"
                         % (where, kind, spec["rng"]))
    a = []
    for one in _P[kind][0].split():
        name, _, d = one.partition("=")
        if name not in spec and not d:
            raise ValueError("%s (%s): missing argument %r" % (where, kind, name))
        v = spec[name] if name in spec else int(d)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("%s (%s): %s must be an int >= 1, got %r" % (where, kind, name, v))
        if v > MAX_PARAMS:
            raise ValueError("%s (%s): %s = %d is more than the limit MAX_PARAMS = %d"
                             % (where, kind, name, v, MAX_PARAMS))
        a.append(v)
    b = spec.get("use_bias", True)
    if not isinstance(b, bool):
        raise ValueError("%s (%s): use_bias must be true or false, got %r" % (where, kind, b))
    if kind == "Conv1D" and a[0] % a[3]:
        raise ValueError("%s (Conv1D): groups=%d must divide in_channels=%d" % (where, a[3], a[0]))
    return a, b


def _expand(kind, a, b, prefix, top, out, tot):
    # tot[0] += parameters, tot[1] += table floats; out (None: count only) gets (name, shape)
    for item in _P[kind][1].split():
        head, dims = item.split(":")
        rep = 1
        if "*" in dims:
            dims, k = dims.split("*")
            rep = a[int(k)]
        vals = []
        for d in dims.split(","):
            if d[0] == "=":
                vals.append(int(d[1:]))
                continue
            i, _, j = d.partition("/")
            vals.append(a[int(i)] // a[int(j)] if j else a[int(i)])
        if ">" in head or "^" in head:
            pre, sub = head.split(">" if ">" in head else "^")
            if "^" in head and not top:
                pre = ""
            if out is None:             # one part, times how many: 10**6 blocks cost one step
                t = [0, 0]
                _expand(sub, vals, b, "", False, None, t)
                tot[0] += rep * t[0]
                tot[1] += rep * t[1]
            else:
                for r in range(rep):
                    _expand(sub, vals, b, prefix + pre.replace("#", str(r)), False, out, tot)
            continue
        n = shape_size(vals)
        if head == "~":
            tot[1] += n
        elif b or not head.endswith("?"):
            tot[0] += n
            if out is not None:
                out.append((prefix + head.rstrip("?"), tuple(vals)))


def _walk(spec, where, depth, tot, out, prefix):
    # checks types, nesting and shape arguments; stops at the first layer past MAX_PARAMS
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
            # the model's names: '<index>.<name>'; a Sequential inside: its layers' own names
            _walk(layers[i], "%s.layers[%d]" % (where, i), depth + 1, tot, out,
                  "%d." % i if depth == 0 else prefix)
        return
    if kind in ("NamedSequential", "Residual"):
        _container(spec, kind, where, depth, tot, out, prefix)
        return
    if kind not in _P:
        raise ValueError("%s: unknown layer type %r (known: Sequential, NamedSequential, Residual, %s)"
                         % (where, kind, ", ".join(sorted(_P))))
    a, b = _args(spec, kind, where)
    _expand(kind, a, b, prefix, depth == 0, out, tot)
    if tot[0] + tot[1] > MAX_PARAMS:
        raise ValueError("%s (%s): the spec declares at least %d parameters and %d floats of fixed tables "
                         "up to here, more than the limit MAX_PARAMS = %d" % (where, kind, tot[0], tot[1], MAX_PARAMS))


def _container(spec, kind, where, depth, tot, out, prefix):
    # graph.py's containers: a NamedSequential's names are prefixes of its layers' names, a
    # Residual adds none
    if depth >= MAX_DEPTH:
        raise ValueError("%s: containers nested more than MAX_DEPTH = %d deep" % (where, MAX_DEPTH))
    if kind == "Residual":
        _walk(spec.get("inner"), where + ".inner", depth + 1, tot, out, prefix)
        return
    layers = spec.get("layers")
    names = spec.get("names")
    if not isinstance(layers, list) or not isinstance(names, list) or len(names) != len(layers) or \
            not all(isinstance(n, str) for n in names):
        raise ValueError("%s (NamedSequential) needs 'layers' and as many 'names' (strings), got %s, %s"
                         % (where, _short(layers), _short(names)))
    for i in range(len(layers)):
        _walk(layers[i], "%s.layers[%d]" % (where, i), depth + 1, tot, out, prefix + names[i])


# ---- LoRA adapters: spec['lora'] = [{"rank": r, "alpha": a, "targets": [linear names]}, ...] ----
# The linear maps an adapter may sit on, per layer type, named as mf.lora.linears names them:
# "name:i,o" (in = argument i, out = argument o; "" names the layer itself), "prefix>Type:dims"
# a part, "#" / "*k" as in _P. An adapter on linear N adds N.lora_A [r, in] and N.lora_B [out, r].
_LIN = {
    "Dense": ":0,1",
    "Attention": "q_proj:0,0 k_proj:0,0 v_proj:0,0 out_proj:0,0",
    "FeedForward": "linear1:0,1 linear2:1,0",
    "EncoderBlock": "self_attn.>Attention:0,1 >FeedForward:0,2",
    "DecoderBlock": "self_attn.>Attention:0,1 multihead_attn.>Attention:0,1 >FeedForward:0,2",
    "Transformer": "encoder.layers.#.>EncoderBlock:2,3,4*5 decoder.layers.#.>DecoderBlock:2,3,4*6 "
                   "generator.>Dense:2,1",
}


def _lin(kind, a, prefix, out):
    for item in _LIN.get(kind, "").split():
        head, dims = item.split(":")
        rep = 1
        if "*" in dims:
            dims, k = dims.split("*")
            rep = a[int(k)]
        vals = [a[int(d)] for d in dims.split(",")]
        if ">" in head:
            pre, sub = head.split(">")
            for r in range(rep):
                _lin(sub, vals, prefix + pre.replace("#", str(r)), out)
        else:
            name = prefix + head
            out[name[:-1] if name.endswith(".") else name] = (vals[0], vals[1])


def _lin_named(spec, prefix, out):
    # graph.py's containers: a NamedSequential's names prefix its layers' maps, a Residual adds none
    kind = spec.get("type")
    if kind == "NamedSequential":
        for i in range(len(spec["layers"])):
            _lin_named(spec["layers"][i], prefix + spec["names"][i], out)
    elif kind == "Residual":
        _lin_named(spec["inner"], prefix, out)
    elif kind in _LIN:
        _lin(kind, _args(spec, kind, "")[0], prefix, out)


def linear_maps(spec):
    """{name: (in, out)} of every linear map of a (top-level) spec an adapter may sit on, named as
    mf.lora.linears(model) names them (layers of a Sequential nested in the top one: none)."""
    out = {}
    if spec.get("type") in ("NamedSequential", "Residual"):
        _lin_named(spec, "", out)
    elif spec.get("type") == "Sequential":
        layers = spec["layers"]
        for i in range(len(layers)):
            if layers[i].get("type") in _LIN:
                _lin(layers[i]["type"], _args(layers[i], layers[i]["type"], "")[0], "%d." % i, out)
    elif spec["type"] in _LIN:
        _lin(spec["type"], _args(spec, spec["type"], "")[0], "", out)
    return out


def _num(v):
    return not isinstance(v, bool) and isinstance(v, (int, float))


def lora_tensors(spec, out, tot):
    """Check spec['lora'] (if any) against the spec's linear maps; out (None: count only) gets the
    adapters' (name, shape), tot[0] their parameters."""
    groups = spec.get("lora")
    if groups is None:
        return
    where = "spec.lora"
    if not isinstance(groups, list) or not groups:
        raise ValueError("%s must be a non-empty list of {rank, alpha, targets}, got %s" % (where, _short(groups)))
    lins = linear_maps(spec)
    seen = {}
    for g in range(len(groups)):
        e = groups[g]
        w = "%s[%d]" % (where, g)
        if not isinstance(e, dict) or sorted(e) != ["alpha", "rank", "targets"]:
            raise ValueError("%s must be {'rank', 'alpha', 'targets'}, got %s" % (w, _short(e)))
        r = e["rank"]
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_PARAMS:
            raise ValueError("%s.rank must be an int >= 1, got %r" % (w, r))
        if not _num(e["alpha"]) or not e["alpha"] > 0:
            raise ValueError("%s.alpha must be a positive number, got %r" % (w, e["alpha"]))
        t = e["targets"]
        if not isinstance(t, list) or not t:
            raise ValueError("%s.targets must be a non-empty list of linear map names, got %s" % (w, _short(t)))
        for name in t:
            if name not in lins:
                raise ValueError("%s.targets: %r is no linear map of the spec (it has %s)"
                                 % (w, name, _short(sorted(lins))))
            if name in seen:
                raise ValueError("%s.targets: %r has two adapters" % (w, name))
            seen[name] = 1
            i, o = lins[name]
            tot[0] += r * (i + o)
            if out is not None:
                pre = name + "." if name else ""
                out.append((pre + "lora_A", (r, i)))
                out.append((pre + "lora_B", (o, r)))
        if tot[0] + tot[1] > MAX_PARAMS:
            raise ValueError("%s: the spec declares %d parameters and %d floats of fixed tables up to here, "
                             "more than the limit MAX_PARAMS = %d" % (w, tot[0], tot[1], MAX_PARAMS))


def plan(spec):
    """(parameters, fixed-table floats) the model of `spec` would allocate, read off the spec
    alone; ValueError naming the layer when the spec is malformed or exceeds MAX_PARAMS."""
    if isinstance(spec, dict) and "format" in spec and spec["format"] != FORMAT:
        raise ValueError("spec: format %r, expected %r" % (spec["format"], FORMAT))
    tot = [0, 0]
    _walk(spec, "spec", 0, tot, None, "")
    lora_tensors(spec, None, tot)
    return tot[0], tot[1]


def named_shapes(spec):
    """[(name, shape)] of the model `spec` describes, as checkpoint.save names them (after
    plan(spec), which bounds the sizes)."""
    out = []
    tot = [0, 0]
    _walk(spec, "spec", 0, tot, out, "")
    lora_tensors(spec, out, tot)
    return out


def layer_list_spec(layers, where):
    """The spec an older checkpoint's meta['layers'] means: [class name, *args] (a trailing dict:
    kwargs), e.g. [["Dense", 4, 16], ["ActivationLayer", "relu"]], the positions named by the
    constructors' argument order; nothing is built. ValueError naming the bad entry."""
    if not isinstance(layers, list):
        raise ValueError("%s: meta['layers'] must be a list, got %s" % (where, _short(layers)))
    out = []
    for i in range(len(layers)):
        one = layers[i]
        bad = "%s: meta['layers'][%d] %s: " % (where, i, _short(one))
        if not isinstance(one, list) or not one or not isinstance(one[0], str) or one[0] not in _P:
            raise ValueError(bad + "must be [layer name, *args] with a name from %s" % ", ".join(sorted(_P)))
        args = list(one[1:])
        kw = args.pop() if args and isinstance(args[-1], dict) else {}
        names = _P[one[0]][2].split()
        if len(args) > len(names):
            raise ValueError(bad + "%s takes at most %d arguments, got %d" % (one[0], len(names), len(args)))
        spec = {"type": one[0]}
        for j in range(len(args)):
            if names[j] in kw:
                raise ValueError(bad + "%r given twice" % names[j])
            if names[j] != "rng" or args[j] is not None:
                spec[names[j]] = args[j]
        spec.update(kw)
        out.append(spec)
    return {"type": "Sequential", "layers": out, "format": FORMAT}
