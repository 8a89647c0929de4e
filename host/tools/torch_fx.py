"""Your torch module as you wrote it: its forward captured with torch.fx and mapped onto microformer.

    from torch_fx import convert
    conv = convert(GestureNet())      # conv.model: a microformer NamedSequential, no weights yet

torch_io.from_torch / load_into / the command line use it for every module that is not an
nn.Sequential of known modules. torch.fx.symbolic_trace runs forward once on proxies and records
the calls it makes; the modules torch_io knows (Linear, Conv1d, pools, LayerNorm, Embedding,
MultiheadAttention, TransformerEncoderLayer / TransformerEncoder, activations, Dropout, Flatten)
stay whole, and the functions and methods between them map onto layers (SUPPORTED below). The
layer names are the module's own: the model's state_dict keys are the module's state_dict keys.
Layouts: a Conv1d / pool takes [B, C, L] in torch, and microformer's [B, L, C]; the converted
model takes [B, L, C] wherever torch's takes [B, C, L] first, a transpose between the two
layouts is folded away, and the Linear after a flatten of [B, C, L] gets its columns reordered
(conv.perms), as torch_io does for an nn.Sequential. Anything else is refused naming the node, its
op and the line of your source it came from.
"""
import operator
import os
import re

import torch
from torch import nn
from torch.nn import functional as F

import microformer as mf
from microformer.graph import NamedSequential, PositionTable, PrependToken, Residual, SelectPosition, SeqReduce

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

# what the fx path maps (host/README.md "From PyTorch" has it as a table)
SUPPORTED = ("modules: Linear, Conv1d, MaxPool1d, AvgPool1d, AdaptiveAvgPool1d(1), Flatten, LayerNorm, Embedding, "
             "MultiheadAttention, TransformerEncoderLayer, TransformerEncoder, ReLU/GELU/Tanh/Sigmoid/LeakyReLU, "
             "Dropout, Softmax (last); functions and methods: relu gelu tanh sigmoid leaky_relu dropout, "
             "transpose/permute of the last two axes (folded), mean/sum/amax over the sequence, "
             "adaptive_avg_pool1d(x, 1).squeeze(-1), flatten/view/reshape, "
             "x + f(x) (residual), x + a learned [1, L, E] table, x[:, i], torch.cat of a learned [1, 1, E] token, "
             "softmax/log_softmax (last), "
             "contiguous")

_ACT_FN = {torch.relu: "relu", F.relu: "relu", torch.tanh: "tanh", F.tanh: "tanh", torch.sigmoid: "sigmoid",
           F.sigmoid: "sigmoid"}
_ACT_METHOD = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}
_SOFTMAX = (torch.softmax, F.softmax, torch.log_softmax, F.log_softmax)
_IDENTITY_METHODS = ("contiguous", "clone", "float")
_REDUCE = {"mean": "mean", "sum": "sum", "amax": "max"}
_ADD = (operator.add, operator.iadd, torch.add)

# layouts of a value: what torch holds vs what microformer holds
CL = "channels last"            # same tensor on both sides ([B, S, E], [B, F], token ids)
CF = "[B, C, L]"                # torch [B, C, L], microformer [B, L, C]
CF_FLAT = "[B, C*L] flattened from [B, C, L]"
CF_POOLED = "[B, C, 1]"


class Refused(ValueError):
    pass


class _Tracer(torch.fx.Tracer):
    """torch.nn modules (but Sequential) and torch_io's helper modules stay whole."""

    def __init__(self, leaves):
        super().__init__()
        self.record_stack_traces = True
        self._leaves = leaves

    def is_leaf_module(self, m, qualname):
        return isinstance(m, self._leaves) or super().is_leaf_module(m, qualname)


def _where(node):
    # 'file.py:12 `h = ...`': the line of the user's source the node came from
    tb = node.stack_trace or ""
    hits = [h for h in re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', tb)
            if not os.path.abspath(h[0]).startswith(_TORCH_DIR)]
    if not hits:
        return "(no source line recorded)"
    f, line, code = hits[-1]
    return "%s:%s `%s`" % (f.rsplit("/", 1)[-1], line, code.strip())


def _op(node):
    t = node.target
    if node.op == "call_function":
        t = getattr(t, "__name__", str(t))
    return "%s %s" % (node.op, t)


class Conversion:
    """convert(): .model (no weights), .perms {state_dict key: (C, L)}, .channels_first, .in_channels,
    .notes (what the user should know: a dropped softmax)."""

    def __init__(self, module, ignore_dropout, torch_io):
        self.module = module
        self.io = torch_io
        self.ignore_dropout = ignore_dropout
        self.perms = {}
        self.channels_first = False
        self.in_channels = None
        self.notes = []
        self.channels = None            # C of a [B, C, L] value, when known
        self.name = type(module).__name__
        leaves = (torch_io.GlobalAvgPool, torch_io.PositionalEncoding, torch_io.FeedForward,
                  torch_io.LearnedPositionalEmbedding, torch_io.Reshape, torch_io.SelfAttention,
                  torch_io.ChannelsLastConv1d, torch_io.ChannelsLastMaxPool1d, torch_io.ChannelsLastAvgPool1d)
        try:
            graph = _Tracer(leaves).trace(module)
        except Exception as e:        # data-dependent control flow, unsupported Python
            msg = " ".join(str(e).split())[:300]
            raise Refused("from_torch: %s: torch.fx cannot trace its forward (%s: %s); forward must not branch on "
                          "tensor values" % (self.name, type(e).__name__, msg))
        self.graph = graph
        self.nodes = list(graph.nodes)
        self._data()
        self.model = self._build()

    # ---- the graph ---------------------------------------------------------------------

    def refuse(self, node, why):
        raise Refused("from_torch: %s: node %r (%s) at %s: %s" % (self.name, node.name, _op(node), _where(node), why))

    def _data(self):
        # which nodes carry the input's values (not shapes, sizes, parameters or masks)
        ins = [n for n in self.nodes if n.op == "placeholder"]
        if not ins:
            raise Refused("from_torch: %s: forward takes no input" % self.name)
        for n in ins[1:]:
            if not (n.args and n.args[0] is None):
                self.refuse(n, "forward takes a second input; one input (the model's) is supported")
        self.input = ins[0]
        self.is_data = {self.input: True}
        for n in self.nodes:
            if n is self.input or n.op in ("placeholder", "output", "get_attr"):
                continue
            if n.op == "call_method" and n.target in ("size", "dim") or \
                    n.op == "call_function" and n.target is getattr and n.args[1] in ("shape", "dtype", "device"):
                continue                                  # sizes are not values
            if any(self.is_data.get(a) for a in _inputs(n)):
                self.is_data[n] = True
        outs = [n for n in self.nodes if n.op == "output"]
        res = outs[0].args[0]
        if not isinstance(res, torch.fx.Node) or not self.is_data.get(res):
            raise Refused("from_torch: %s: forward must return one tensor computed from its input, got %r"
                          % (self.name, res))
        self.output = res
        self.anc = {}
        for n in self.nodes:
            if self.is_data.get(n):
                a = set()
                for m in _inputs(n):
                    if self.is_data.get(m):
                        a.add(m)
                        a |= self.anc[m]
                self.anc[n] = a

    def _main(self, n):
        # the one data input of node n (the value it transforms); None for the input itself
        d = []
        for a in _inputs(n):
            if self.is_data.get(a) and a not in d:
                d.append(a)
        if not d:
            return None
        if len(d) == 1:
            return d[0]
        self.refuse(n, "it combines values computed from the input (%s); only x + f(x) (a residual) is supported"
                    % ", ".join(a.name for a in d))

    def _chain(self, end, start):
        # the nodes from `start` (exclusive) to `end`, in order; a residual add as ('residual', add, skip, branch)
        out = []
        n = end
        while n is not start:
            if n is None or n is self.input and start is not self.input:
                raise Refused("from_torch: %s: internal: no path" % self.name)
            if _is_add(n) and len([a for a in n.args[:2] if self.is_data.get(a)]) == 2:
                a, b = n.args[0], n.args[1]
                if a is b:
                    self.refuse(n, "x + x: add a value to itself (write 2 * x) is not supported")
                if a in self.anc[b]:
                    skip, branch = a, b
                elif b in self.anc[a]:
                    skip, branch = b, a
                else:
                    self.refuse(n, "adds %s and %s, neither computed from the other: only x + f(x) is a residual"
                                % (a.name, b.name))
                out.append(("residual", n, skip, branch))
                n = skip
                continue
            out.append(n)
            n = self._main(n)
        out.reverse()
        return out

    def _build(self):
        self.seen = {self.input: True}
        self.layout = None            # unknown until the first node says
        self.rank = None
        layers, names = self._run(self._chain(self.output, self.input), [])
        for n in self.nodes:
            if self.is_data.get(n) and n not in self.seen:
                self.refuse(n, "its value is used more than once or off the model's path (only chains of layers "
                               "and x + f(x) residuals map onto microformer)")
        if self.layout in (CF, CF_FLAT, CF_POOLED):
            raise Refused("from_torch: %s: its output is %s in torch but would be channels last in microformer: "
                          "end it with a flatten + Linear or a mean over L" % (self.name, self.layout))
        return NamedSequential(layers, names)

    def _run(self, items, context):
        layers, names = [], []
        for k in range(len(items)):
            it = items[k]
            if isinstance(it, tuple):
                _, add, skip, branch = it
                self.seen[add] = True
                before = (self.layout, self.rank)
                if self.layout not in (CL, CF, None):
                    self.refuse(add, "a residual around a value in layout %s" % self.layout)
                inner, inner_names = self._run(self._chain(branch, skip), items[k + 1:])
                if (self.layout, self.rank) != before and before[0] is not None:
                    self.refuse(add, "the residual branch changes the value's layout (%s -> %s)" % (before[0], self.layout))
                layers.append(Residual(NamedSequential(inner, inner_names)))
                names.append("")
                continue
            if it in self.seen:             # (MultiheadAttention's [0], taken with it)
                continue
            self.seen[it] = True
            got = self._node(it, items[k + 1:] + context)
            for layer, name in got:
                layers.append(layer)
                names.append(name)
        return layers, names

    # ---- one node -------------------------------------------------------------------------

    def _node(self, n, after):
        """[(layer, name prefix)] for node n (empty: folded away)."""
        if n.op == "call_module":
            return self._module(n, self.module.get_submodule(n.target), n.target, after)
        if n.op == "call_function":
            return self._function(n, n.target, after)
        if n.op == "call_method":
            return self._method(n, n.target, after)
        self.refuse(n, "no microformer layer for it")

    def _set(self, layout, rank=None):
        self.layout = layout
        self.rank = rank

    def _plain(self, n, what):
        # n takes a channels-last value (as microformer holds it)
        if self.layout in (CF, CF_FLAT, CF_POOLED):
            self.refuse(n, "%s gets a value in layout %s (torch) where microformer holds [B, L, C]: transpose it "
                           "back (x.transpose(1, 2)) or flatten it first" % (what, self.layout))
        if self.layout is None:
            self.layout = CL

    def _module(self, n, m, target, after):
        io = self.io
        pre = target + "."
        if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
            return self._softmax(n, after, getattr(m, "dim", None))
        kind = io._activation_kind(m, target)
        if kind:
            return [(mf.ActivationLayer(kind), "")]
        if isinstance(m, nn.Dropout):
            return [(mf.Dropout(io._p(m.p, self.ignore_dropout)), "")]
        if isinstance(m, nn.Identity):
            return []
        if isinstance(m, (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)) \
                and not isinstance(m, (io.ChannelsLastConv1d, io.ChannelsLastMaxPool1d, io.ChannelsLastAvgPool1d)):
            return self._conv_pool(n, m, pre)
        if isinstance(m, nn.Flatten):
            if m.start_dim != 1 or m.end_dim != -1:
                self.refuse(n, "only Flatten(start_dim=1, end_dim=-1) is supported")
            return self._flatten(n, after)
        if isinstance(m, nn.Linear):
            return self._linear(n, m, pre)
        if isinstance(m, nn.MultiheadAttention) and not isinstance(m, io.SelfAttention):
            return self._mha(n, m, pre)
        if isinstance(m, nn.TransformerEncoderLayer):
            return [(self._encoder_layer(n, m, target, n.kwargs, n.args[1:]), pre)]
        if isinstance(m, nn.TransformerEncoder):
            return self._encoder(n, m, pre)
        try:
            layer = io._Conversion._layer(self._leaf_helper(), m, target)
        except ValueError as e:
            why = str(e).split(": ", 1)[-1]
            if "no microformer layer for it" in why:
                why = "%s: no microformer layer for it (supported: %s)" % (type(m).__name__, SUPPORTED)
            self.refuse(n, why)
        if isinstance(m, nn.Embedding):
            if self.layout is not None:
                self.refuse(n, "an Embedding must take the model's input (token ids)")
            self._set(CL, 3)
        else:
            self._plain(n, type(m).__name__)
        return [(layer, pre)]

    def _leaf_helper(self):
        h = object.__new__(self.io._Conversion)
        h.ignore_dropout = self.ignore_dropout
        return h

    def _linear(self, n, m, pre):
        if self.layout == CF_FLAT:
            self.perms[pre + "weight"] = (self.channels, m.in_features // self.channels)
            self._set(CL, 2)
        elif self.layout == CF:
            self.refuse(n, "a Linear on [B, C, L] acts on the L axis (microformer holds [B, L, C]): flatten first or "
                           "transpose back to [B, L, C]")
        else:
            self._plain(n, "Linear")
        return [(mf.Dense(m.in_features, m.out_features, use_bias=m.bias is not None), pre)]

    def _conv_pool(self, n, m, pre):
        io = self.io
        if self.layout is None:
            self.channels_first = True
            self.channels = None
        elif self.layout != CF:
            self.refuse(n, "%s takes [B, C, L]; its input here is %s" % (type(m).__name__, self.layout))
        self._set(CF, 3)
        if isinstance(m, nn.Conv1d):
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                self.refuse(n, "padding_mode=%r, padding=%r (zeros, an int)" % (m.padding_mode, m.padding))
            if getattr(self, "channels", None) is None:
                if self.channels_first and self.in_channels is None:
                    self.in_channels = m.in_channels
            elif m.in_channels != self.channels:
                self.refuse(n, "in_channels=%d, its input has %d channels" % (m.in_channels, self.channels))
            self.channels = m.out_channels
            one = io._one
            return [(mf.Conv1D(m.in_channels, m.out_channels, one(m.kernel_size, pre, m, "kernel_size"),
                               stride=one(m.stride, pre, m, "stride"), padding=one(m.padding, pre, m, "padding"),
                               dilation=one(m.dilation, pre, m, "dilation"), groups=m.groups,
                               use_bias=m.bias is not None), pre)]
        if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)):
            if isinstance(m, nn.AdaptiveMaxPool1d) or io._one(m.output_size, pre, m, "output_size") != 1:
                self.refuse(n, "only AdaptiveAvgPool1d(1) (the mean over L) is supported")
            self._set(CF_POOLED, 3)
            return [(mf.GlobalAvgPool(), "")]
        try:
            return [(io._Conversion._pool(self._leaf_helper(), m, pre), "")]
        except ValueError as e:
            self.refuse(n, str(e).split(": ", 1)[-1])

    def _mha(self, n, m, pre):
        a = list(n.args) + [None] * 3
        q, k, v = a[0], a[1] if a[1] is not None else n.kwargs.get("key"), a[2] if a[2] is not None else \
            n.kwargs.get("value")
        if not (q is k is v):
            self.refuse(n, "MultiheadAttention(q, k, v) with different q, k, v: self-attention (the same value "
                           "three times) is supported")
        causal = self._mask_args(n, n.kwargs, ("attn_mask",), "is_causal")
        if n.kwargs.get("key_padding_mask") is not None:
            self.refuse(n, "key_padding_mask is not supported here")
        users = list(n.users)
        if len(users) != 1 or not (users[0].op == "call_function" and users[0].target is operator.getitem
                                   and users[0].args[1] == 0):
            self.refuse(n, "use MultiheadAttention's output as attn(x, x, x)[0]")
        self.seen[users[0]] = True
        self._plain(n, "MultiheadAttention")
        if not m.batch_first:
            self.refuse(n, "needs batch_first=True")
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            self.refuse(n, "kdim/vdim other than embed_dim and add_bias_kv are not supported")
        return [(mf.Attention(m.embed_dim, m.num_heads, use_bias=m.in_proj_bias is not None, causal=causal,
                              dropout=self.io._p(m.dropout, self.ignore_dropout)), pre)]

    def _mask_args(self, n, kwargs, mask_names, causal_name, positional=()):
        # a mask is taken as causal when is_causal=True says so; any other mask is refused
        mask = [kwargs.get(k) for k in mask_names] + [p for p in positional if p is not None]
        causal = kwargs.get(causal_name)
        if any(isinstance(x, torch.fx.Node) and self.is_data.get(x) for x in mask):
            self.refuse(n, "a mask computed from the input's values is not supported")
        if any(x is not None for x in mask) and causal is not True:
            self.refuse(n, "an attention mask is supported only as a causal mask with %s=True" % causal_name)
        if causal not in (None, False, True):
            self.refuse(n, "%s must be a constant True or False" % causal_name)
        return causal is True

    def _encoder_layer(self, n, m, where, kwargs, positional):
        causal = self._mask_args(n, kwargs, ("src_mask", "mask"), "is_causal", positional)
        if kwargs.get("src_key_padding_mask") is not None:
            self.refuse(n, "src_key_padding_mask is not supported here")
        self._plain(n, "TransformerEncoderLayer")
        try:
            block = self.io._Conversion._transformer_layer(self._leaf_helper(), m, where)
        except ValueError as e:
            self.refuse(n, str(e).split(": ", 1)[-1])
        if causal:
            block = mf.EncoderBlock(block.embed_dim, block.attn.num_heads, block.ffn.hidden, causal=True,
                                    activation=block.ffn.kind, use_bias=bool(block.attn.use_bias),
                                    dropout=block.dropout, **({} if block.norm_first else {"norm_first": False}))
        return block

    def _encoder(self, n, m, pre):
        out = []
        for i, layer in enumerate(m.layers):
            out.append((self._encoder_layer(n, layer, "%slayers.%d" % (pre, i), n.kwargs, n.args[1:]),
                        "%slayers.%d." % (pre, i)))
        if m.norm is not None:
            try:
                out.append((io_layer(self, m.norm, pre + "norm"), pre + "norm."))
            except ValueError as e:
                self.refuse(n, str(e).split(": ", 1)[-1])
        return out

    # ---- functions and methods -------------------------------------------------------------

    def _function(self, n, f, after):
        if f in _ACT_FN:
            return self._act(n, _ACT_FN[f])
        if f is F.gelu:
            return self._act(n, "gelu_tanh" if n.kwargs.get("approximate") == "tanh" else "gelu")
        if f is F.leaky_relu:
            slope = n.args[1] if len(n.args) > 1 else n.kwargs.get("negative_slope", 0.01)
            if slope != 0.01:
                self.refuse(n, "leaky_relu slope %r (microformer's is 0.01)" % (slope,))
            return self._act(n, "leaky_relu")
        if f is F.dropout:
            p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
            return [(mf.Dropout(self.io._p(p, self.ignore_dropout)), "")]
        if f in _SOFTMAX:
            return self._softmax(n, after, n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"))
        if f is torch.transpose:
            return self._transpose(n, n.args[1:3])
        if f is torch.permute:
            return self._permute(n, n.args[1] if len(n.args) > 1 else n.kwargs.get("dims"))
        if f is torch.flatten:
            return self._flatten_call(n, n.args[1:], n.kwargs, after)
        if f is torch.reshape:
            return self._view(n, n.args[1] if len(n.args) > 1 else n.kwargs.get("shape"), after)
        if f in (torch.mean, torch.sum, torch.amax):
            return self._reduce(n, f.__name__, n.args[1:], n.kwargs)
        if f is operator.getitem:
            return self._getitem(n, n.args[1])
        if f is torch.cat:
            return self._cat(n)
        if f in _ADD:
            return self._add_table(n)
        if f is F.adaptive_avg_pool1d:
            size = n.args[1] if len(n.args) > 1 else n.kwargs.get("output_size")
            if size not in (1, (1,), [1]) or self.layout != CF:
                self.refuse(n, "adaptive_avg_pool1d(x, 1) of a [B, C, L] value (the mean over L) is supported")
            self._set(CF_POOLED, 3)
            return [(mf.GlobalAvgPool(), "")]
        if f is torch.squeeze:
            return self._squeeze(n, n.args[1:])
        self.refuse(n, "no microformer layer for it (supported: %s)" % SUPPORTED)

    def _method(self, n, name, after):
        if name in _ACT_METHOD:
            return self._act(n, _ACT_METHOD[name])
        if name in _IDENTITY_METHODS:
            return []
        if name in ("softmax", "log_softmax"):
            return self._softmax(n, after, n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"))
        if name == "transpose":
            return self._transpose(n, n.args[1:3])
        if name == "permute":
            dims = n.args[1:]
            if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                dims = dims[0]
            return self._permute(n, dims or n.kwargs.get("dims"))
        if name == "flatten":
            return self._flatten_call(n, n.args[1:], n.kwargs, after)
        if name in ("view", "reshape"):
            shape = n.args[1:]
            if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
                shape = shape[0]
            return self._view(n, shape, after)
        if name in _REDUCE:
            return self._reduce(n, name, n.args[1:], n.kwargs)
        if name in ("add", "__add__"):
            return self._add_table(n)
        if name == "squeeze":
            return self._squeeze(n, n.args[1:] or [n.kwargs.get("dim")])
        self.refuse(n, "no microformer layer for it (supported: %s)" % SUPPORTED)

    def _act(self, n, kind):
        if self.layout is None:
            self.layout = CL
        return [(mf.ActivationLayer(kind), "")]

    def _softmax(self, n, after, dim):
        if any(self._real(a) for a in after):
            self.refuse(n, "softmax is supported as the model's last operation only (microformer models output "
                           "logits; a session's predictions are their softmax)")
        self.notes.append("%s: the last %s (%s) is left out: the microformer model outputs logits (finetune.Session "
                          "trains on them with cross-entropy and predicts their softmax)" % (
                              self.name, n.name, _where(n)))
        return []

    def _real(self, item):
        return isinstance(item, tuple) or not (item.op == "call_method" and item.target in _IDENTITY_METHODS)

    def _dims3(self, n, dims):
        r = self.rank or 3
        if r != 3:
            self.refuse(n, "a transpose of a %d-d value; transposes of [B, L, C] <-> [B, C, L] are supported" % r)
        out = []
        for d in dims:
            if not isinstance(d, int):
                self.refuse(n, "dimensions must be constant ints, got %r" % (d,))
            out.append(d % 3)
        return out

    def _transpose(self, n, dims):
        d = self._dims3(n, dims)
        if sorted(d) != [1, 2]:
            self.refuse(n, "only transpose(1, 2) of [B, L, C] <-> [B, C, L] is supported, got transpose%r"
                        % (tuple(dims),))
        return self._flip(n)

    def _permute(self, n, dims):
        if not isinstance(dims, (tuple, list)) or len(dims) != 3 or self._dims3(n, dims) != [0, 2, 1]:
            self.refuse(n, "only permute(0, 2, 1) of [B, L, C] <-> [B, C, L] is supported, got %r" % (dims,))
        return self._flip(n)

    def _flip(self, n):
        # the transpose is folded: microformer keeps [B, L, C] and notes the torch layout
        if self.layout is None:               # torch's input is [B, L, C] and goes channels first
            self._set(CF, 3)
            self.channels = None
        elif self.layout == CF:
            self._set(CL, 3)
        elif self.layout == CL:
            self._set(CF, 3)
            self.channels = None
        else:
            self.refuse(n, "a transpose of a value in layout %s" % self.layout)
        return []

    def _flatten_call(self, n, args, kwargs, after):
        start = args[0] if args else kwargs.get("start_dim", 0)
        end = args[1] if len(args) > 1 else kwargs.get("end_dim", -1)
        if start != 1 or end != -1:
            self.refuse(n, "only flatten(start_dim=1) is supported, got start_dim=%r, end_dim=%r" % (start, end))
        return self._flatten(n, after)

    def _view(self, n, shape, after):
        shape = list(shape or ())
        if not shape or not self._batch_dim(shape[0]):
            self.refuse(n, "view/reshape must keep the batch axis first (x.view(x.size(0), ...) or -1 first), got %r"
                        % (shape,))
        rest = shape[1:]
        if rest == [-1]:
            return self._flatten(n, after)
        if shape[0] == -1 and any(d == -1 for d in rest) or not all(isinstance(d, int) and d >= 1 for d in rest):
            self.refuse(n, "view/reshape to [B, %s]: constant sizes (or one -1 to flatten) are supported"
                        % ", ".join(str(d) for d in rest))
        self._plain(n, "view/reshape")
        self._set(CL, 1 + len(rest))
        return [(mf.Reshape(tuple(rest)), "")]

    def _batch_dim(self, d):
        if d == -1:
            return True
        if isinstance(d, torch.fx.Node):        # x.size(0) / x.shape[0]
            if d.op == "call_method" and d.target == "size" and len(d.args) > 1 and d.args[1] == 0:
                return True
            if d.op == "call_function" and d.target is operator.getitem and d.args[1] == 0:
                return True
        return False

    def _flatten(self, n, after):
        # [B, ...] -> [B, n]; n is the in_features of the Linear it feeds (as torch_io's Sequential path)
        if self.rank == 2 and self.layout == CL:
            return []
        size = None
        for it in after:
            if isinstance(it, tuple):
                break
            if it.op == "call_module":
                m = self.module.get_submodule(it.target)
                if isinstance(m, nn.Linear):
                    size = m.in_features
                    break
                if isinstance(m, nn.Dropout) or self.io._activation_kind(m, it.target):
                    continue
                break
            if it.op == "call_method" and (it.target in _ACT_METHOD or it.target in _IDENTITY_METHODS):
                continue
            if it.op == "call_function" and (it.target in _ACT_FN or it.target in (F.gelu, F.dropout, F.leaky_relu)):
                continue
            break
        if size is None:
            self.refuse(n, "a flatten must feed an nn.Linear (activations and dropout may come between): its size "
                           "comes from that Linear's in_features")
        if self.layout == CF:
            if getattr(self, "channels", None) is None:
                self.refuse(n, "flattens [B, C, L] whose channel count C is unknown here")
            if size % self.channels:
                self.refuse(n, "the next Linear's in_features=%d is not a multiple of the %d channels"
                            % (size, self.channels))
            self._set(CF_FLAT, 2)
        elif self.layout == CF_FLAT:
            pass
        else:
            self._set(CL, 2)
        return [(mf.Reshape((size,)), "")]

    def _squeeze(self, n, dims):
        # [B, C, 1] -> [B, C] after a pooling to one position: nothing to do in microformer
        d = dims[0] if dims else None
        if self.layout != CF_POOLED or d not in (2, -1):
            self.refuse(n, "squeeze(-1) of a [B, C, 1] value (after adaptive_avg_pool1d(x, 1)) is supported")
        self._set(CL, 2)
        return []

    def _reduce(self, n, name, args, kwargs):
        dim = args[0] if args else kwargs.get("dim")
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        if kwargs.get("keepdim") or len(args) > 1 and args[1]:
            self.refuse(n, "keepdim=True is not supported")
        if not isinstance(dim, int):
            self.refuse(n, "%s over dim=%r: one constant dimension (the sequence axis) is supported" % (name, dim))
        r = self.rank or 3
        d = dim % r
        if r != 3 or self.layout == CF and d != 2 or self.layout in (CL, None) and d != 1:
            self.refuse(n, "%s over dim=%r of a %d-d value in layout %s: the mean / sum / amax over the sequence "
                           "(dim 1 of [B, S, E], dim 2 of [B, C, L]) is supported" % (name, dim, r, self.layout))
        self._set(CL, 2)
        kind = _REDUCE[name]
        return [(mf.GlobalAvgPool() if kind == "mean" else SeqReduce(kind), "")]

    def _getitem(self, n, idx):
        ok = isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None) and isinstance(idx[1], int)
        if not ok:
            self.refuse(n, "indexing %r: x[:, i] (one position of [B, S, E]) is supported" % (idx,))
        if self.layout not in (CL, None) or (self.rank or 3) != 3:
            self.refuse(n, "x[:, i] of a value in layout %s, rank %s: a position of [B, S, E] is supported"
                        % (self.layout, self.rank))
        self._set(CL, 2)
        return [(SelectPosition(idx[1]), "")]

    def _cat(self, n):
        seq = n.args[0]
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if not isinstance(seq, (list, tuple)) or len(seq) != 2 or dim not in (1, -2) or \
                not self.is_data.get(seq[1]) or self.is_data.get(seq[0]):
            self.refuse(n, "torch.cat([token, x], dim=1) (a learned token before the sequence) is supported")
        p = self._param(seq[0])
        if p is None:
            self.refuse(n, "the first part must be a parameter of the module [1, 1, E] (optionally .expand(B, -1, "
                           "-1))")
        target, w = p
        if tuple(w.shape) != (1, 1, w.shape[-1]):
            self.refuse(n, "the token %s is %s; a [1, 1, E] parameter is supported" % (target, list(w.shape)))
        self._plain(n, "torch.cat")
        self._set(CL, 3)
        return [(PrependToken(int(w.shape[-1])), target)]

    def _add_table(self, n):
        # x + self.pos (or self.pos[:, :S]), self.pos a learned [1, L, E] table
        other = [a for a in n.args[:2] if not self.is_data.get(a)]
        p = None
        if len(other) == 1 and isinstance(other[0], torch.fx.Node):
            c = other[0]
            if c.op == "call_function" and c.target is operator.getitem and _leading_slice(c.args[1]):
                c = c.args[0]
            p = self._param(c)
        if p is None or len(n.args) != 2 or n.kwargs:
            self.refuse(n, "adds something other than x + f(x) (a residual) or x + self.pos (a learned [1, L, E] "
                           "table, or self.pos[:, :S])")
        target, w = p
        if w.dim() != 3 or w.shape[0] != 1:
            self.refuse(n, "the table %s is %s; a [1, L, E] parameter is supported" % (target, list(w.shape)))
        self._plain(n, "x + %s" % target)
        self._set(CL, 3)
        return [(PositionTable(int(w.shape[1]), int(w.shape[2])), target)]

    def _param(self, node):
        # a module parameter, possibly expanded / repeated over the batch
        while isinstance(node, torch.fx.Node) and node.op == "call_method" and node.target in ("expand", "repeat"):
            node = node.args[0]
        if isinstance(node, torch.fx.Node) and node.op == "get_attr":
            try:
                w = self.module.get_parameter(node.target)
            except AttributeError:
                return None
            return node.target, w
        return None


def io_layer(conv, m, where):
    return conv.io._Conversion._layer(conv._leaf_helper(), m, where)


def _leading_slice(idx):
    # [:, :S] (S anything: a size of the input), the positions from 0
    return isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None) and isinstance(idx[1], slice) and \
        idx[1].start in (None, 0) and idx[1].step in (None, 1)


def _inputs(n):
    out = []
    torch.fx.node.map_arg((n.args, n.kwargs), out.append)
    return out


def _is_add(n):
    return (n.op == "call_function" and n.target in _ADD) or (n.op == "call_method" and n.target in ("add", "__add__"))


def convert(module, ignore_dropout, torch_io):
    """Conversion of a torch module with its own forward: .model is a NamedSequential without weights.
    torch_io: the module calling (its helper classes are leaves); passed in, so that this module
    imports nothing of torch_io's and the two make no import circle."""
    return Conversion(module, ignore_dropout, torch_io)
