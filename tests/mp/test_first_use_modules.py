# Code a training program never runs stays off its heap until first used.
# An Attention layer's generation and inspection code (microformer/attndecode.py: the KV cache,
# cross_step, padded decoding, weights() and stages()) stays off the heap of a program that only
# trains: `import microformer`, building a model and a training step leave it unloaded; the first
# prefill (or weights(), ...) loads it once and makes its functions the layer's methods, with the
# same results and messages as before the split. Layer.load_state_dict (microformer/statedict.py)
# likewise: a session loading its checkpoint never imports it.
import helpers

_SCRIPT = r"""
import sys
import microformer as mf
from microformer.attention import Attention
D = "microformer.attndecode"
mf.seed(1)
a = Attention(8, 2, causal=True, max_len=6)
x = mf.Tensor.zeros((1, 3, 8))
for i in range(x.size):
    x.data[i] = ((i * 7) % 11 - 5) * 0.1
y = a.forward(x)
dy = mf.Tensor.zeros(y.shape)
for i in range(dy.size):
    dy.data[i] = 0.01 * i
a.backward(dy)
print("TRAIN", D in sys.modules, "microformer.statedict" in sys.modules)
sd = a.state_dict()
b = Attention(8, 2, causal=True)
try:
    b.load_state_dict({"in_proj_weight": [[0.0] * 8] * 24})
except ValueError as e:
    print("STRICT", str(e))
print("SD", "microformer.statedict" in sys.modules, b.load_state_dict(sd), list(b.Wv.data) == list(a.Wv.data))
try:
    Attention(8, 2).prefill(x, 4)
except ValueError as e:
    print("CAUSAL", str(e))
try:
    a.decode_step(mf.Tensor.zeros((1, 1, 8)))
except RuntimeError as e:
    print("EARLY", str(e))
print("LOADED", D in sys.modules)
m = sys.modules[D]
print("BOUND", Attention.prefill is m.prefill, Attention.decode_step is m.decode_step, Attention.weights is m.weights,
      Attention.stages is m.stages, Attention.cross_step is m.cross_step)
# the cache's steps equal the causal forward over the whole sequence
full = mf.Tensor.zeros((1, 4, 8))
for i in range(full.size):
    full.data[i] = ((i * 5) % 13 - 6) * 0.1
want = list(a.forward(full).data)
p = a.prefill(mf.Tensor.from_list(list(full.data[:24]), (1, 3, 8)))
got = list(p.data)
t = a.decode_step(mf.Tensor.from_list(list(full.data[24:]), (1, 1, 8)))
got += list(t.data)
print("DECODE", max(abs(u - v) for u, v in zip(got, want)) < 1e-5)
print("ROWS", len(a.weights(0, 1)), len(a.weights(0, 1)[0]))
"""


def _check(out):
    assert "TRAIN False False" in out, out            # a training step loads neither
    assert ("STRICT Attention.load_state_dict: missing keys ['in_proj_bias', 'out_proj.weight', 'out_proj.bias'], "
            "unexpected keys [] (expected exactly ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', "
            "'out_proj.bias'])") in out, out
    assert "SD True ([], []) True" in out, out
    assert ("CAUSAL Attention: prefill needs causal=True self-attention (this layer has causal=False)"
            in out), out
    assert "EARLY Attention: decode_step() called before prefill()" in out, out
    assert "LOADED True" in out, out
    assert "BOUND True True True True True" in out, out
    assert "DECODE True" in out, out
    assert "ROWS 3 3" in out, out          # the prefill's forward: 3 queries by 3 keys


def _run(tmp_path, name, text, micropython=None):
    # the script text as the file `name`, run inside `micropython` (None: a CPython subprocess)
    p = tmp_path / name
    p.write_text(text)
    return helpers.run_micropython(p, exe=micropython) if micropython else helpers.run_cpython(p)


def test_decoding_loads_on_first_use(tmp_path, micropython):
    _check(_run(tmp_path, "attndecode_lazy.py", _SCRIPT, micropython))


def test_decoding_loads_on_first_use_cpython(tmp_path):
    _check(_run(tmp_path, "attndecode_lazy.py", _SCRIPT))


# The attention's paths a plain self-attention step never runs (microformer/attnpaths.py: a given
# key padding mask or lengths, cross-attention's context check, kv_tile, the weights' dropout,
# recompute's per-item weights, the stored weights' backward item by item) stay off the heap of a
# training step without them; the first use loads the module once, binds its functions as the
# layer's methods, and gives the same results and messages.
_PATHS = r"""
import sys
import microformer as mf
from microformer.attention import Attention
P = "microformer.attnpaths"
mf.seed(3)
a = Attention(8, 2)
x = mf.Tensor.zeros((2, 3, 8))
for i in range(x.size):
    x.data[i] = ((i * 7) % 11 - 5) * 0.1
dy = mf.Tensor.zeros(x.shape)
for i in range(dy.size):
    dy.data[i] = 0.01 * (i % 9)
a.train()
plain = list(a.forward(x).data)
dx = list(a.backward(dy).data)
print("PLAIN", P in sys.modules)
try:
    a.forward(x, key_padding_mask=[[0, 0, 1]])
except ValueError as e:
    print("MASK", str(e))
print("LOADED", P in sys.modules)
m = sys.modules[P]
print("BOUND", all(getattr(Attention, n) is getattr(m, n) for n in m.METHODS))
try:
    a.forward(x, lengths=[3, 9])
except ValueError as e:
    print("LENGTHS", str(e))
# lengths and the equal mask hide the same keys; a mask of no padding is the plain forward
y1 = list(a.forward(x, lengths=[3, 2]).data)
y2 = list(a.forward(x, key_padding_mask=[[0, 0, 0], [0, 0, 1]]).data)
print("SAME", y1 == y2, list(a.forward(x, key_padding_mask=bytes(6)).data) == plain)
# recompute: per-item weights, the same output and input gradient as the stored path
a.recompute = True
print("ITEMS", list(a.forward(x).data) == plain, list(a.backward(dy).data) == dx)
try:
    Attention(8, 2, dropout=0.1, kv_tile=2)
except ValueError as e:
    print("TILE", str(e))
"""


def _check_paths(out):
    assert "PLAIN False" in out, out                  # a plain training step does not load it
    assert ("MASK Attention: key_padding_mask must be [B,Sk] = [2,3] nested lists, got 1 rows") in out, out
    assert "LOADED True" in out, out
    assert "BOUND True" in out, out
    assert "LENGTHS Attention: lengths[1] must be an int in [0, 3], got 9" in out, out
    assert "SAME True True" in out, out
    assert "ITEMS True True" in out, out
    assert ("TILE Attention: dropout=0.1 needs the stored attention weights, which kv_tile=2 never keeps: "
            "use dropout=0 with kv_tile") in out, out


def test_attention_paths_load_on_first_use(tmp_path, micropython):
    _check_paths(_run(tmp_path, "attnpaths_lazy.py", _PATHS, micropython))


def test_attention_paths_load_on_first_use_cpython(tmp_path):
    _check_paths(_run(tmp_path, "attnpaths_lazy.py", _PATHS))


# The optimizer code a step that goes through never runs (microformer/optrare.py: SGD,
# clip_grad_norm, the dry run, the refusals' messages) stays off the heap of Adam steps; a
# refused step loads it and says what it always said, and SGD resolves through microformer.optim.
_OPT = r"""
import sys
import microformer as mf
from microformer import optim
R = "microformer.optrare"
mf.seed(2)
d = mf.Dense(3, 2)
opt = mf.Adam(d, lr=0.1)
for _ in range(2):
    opt.zero_grad()
    for i in range(d.dW.size):
        d.dW.data[i] = 0.1 * (i + 1)
    opt.step()
print("STEPS", opt.steps, R in sys.modules)
w = list(d.W.data)
d.dW.data[4] = float("nan")
try:
    opt.step()
except mf.NonFiniteError as e:
    print("REFUSED", str(e))
print("KEPT", list(d.W.data) == w, opt.steps)
m = sys.modules[R]
print("BOUND", all(getattr(optim._Optimizer, n) is getattr(m, n) for n in m.METHODS),
      optim.SGD is m.SGD is mf.SGD, optim.clip_grad_norm is m.clip_grad_norm)
"""


def _check_opt(out):
    assert "STEPS 2 False" in out, out
    assert ("REFUSED Adam: step refused: the gradient of param 0 (W) holds nan (element 4); weights and "
            "optimizer state are unchanged (check the inputs, lower lr, or set max_grad_norm)") in out, out
    assert "KEPT True 2" in out, out
    assert "BOUND True True True" in out, out


def test_optimizer_rarer_code_loads_on_first_use(tmp_path, micropython):
    _check_opt(_run(tmp_path, "optrare_lazy.py", _OPT, micropython))


def test_optimizer_rarer_code_loads_on_first_use_cpython(tmp_path):
    _check_opt(_run(tmp_path, "optrare_lazy.py", _OPT))
