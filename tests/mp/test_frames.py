# Frames on the hot paths: every bytecode function a training step or a decode step runs
# through (in the modules listed here) keeps its frame (arguments + locals + value stack) within
# the 11 words MicroPython keeps off the GC heap; a larger frame is allocated on every call and
# slows a loop down as garbage builds up. host/tools/frames.py computes the frames from mpy-cross output.
import os
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, os.path.join(helpers.ROOT, "host", "tools"))
import frames  # noqa: E402

LIB = os.path.join(helpers.ROOT, "lib", "microformer")

# module -> the functions of a training step (Sequential forward/backward, Dense, LayerNorm,
# FeedForward, EncoderBlock, the losses, train_step) and of prefill/decode_step, in that module
HOT = {
    "viper_gemm.py": ["_mm", "matmul_forward", "matmul_forward_kept", "matmul_backward",
                      "matmul_backward_input_acc", "avgpool_forward", "avgpool_backward"],
    "viper_norm.py": ["layernorm_forward", "layernorm_backward"],
    "viper_elementwise.py": ["act_forward", "act_backward"],
    "viper_sequence.py": ["add_forward", "posenc_forward", "embedding_forward", "embedding_backward", "kv_store"],
    "viper_rows.py": ["gather_rows", "argmax"],
    "viper_softmax.py": ["crossentropy_softmax", "_xent_ib"],
    "dense.py": ["Dense.forward", "Dense._product", "Dense.backward", "Dense._grad_input", "Dense._grad_weight"],
    "feedforward.py": ["FeedForward.forward", "FeedForward.backward"],
    "block.py": ["EncoderBlock.forward", "EncoderBlock._run", "EncoderBlock._rest", "EncoderBlock._ffn_of",
                 "EncoderBlock._norm_out", "EncoderBlock._add",
                 "EncoderBlock._post", "EncoderBlock.backward", "EncoderBlock._backward_pre",
                 "EncoderBlock._ffn_back", "EncoderBlock._attn_back", "EncoderBlock._backward_post",
                 "EncoderBlock.prefill", "EncoderBlock.decode_step", "decode_step"],
    "model.py": ["Sequential.forward", "Sequential.backward", "Sequential._train_backward",
                 "Sequential._frozen_backward", "_down"],
    "loss.py": ["CrossEntropyLoss.forward", "CrossEntropyLoss._loss", "CrossEntropyLoss.backward",
                "_labels_ok", "_len", "MSELoss.forward", "MSELoss.backward"],
    "train.py": ["train_step", "_backward", "_correct", "argmax", "Trainer.step", "Trainer._batch",
                 "Trainer._accumulate", "Trainer._part", "Trainer._back", "Trainer._view", "Trainer._labels_of"],
    "pool.py": ["GlobalAvgPool.forward", "GlobalAvgPool.backward"],
    # the 1-D pools pass their sizes as one tuple (kernel_table.py: pool)
    "pool1d.py": ["MaxPool1D.forward", "MaxPool1D.backward", "AvgPool1D.forward", "AvgPool1D.backward"],
    "decoder.py": ["DecoderBlock.forward", "DecoderBlock._check_pair", "DecoderBlock._run", "DecoderBlock._self_fwd",
                   "DecoderBlock._cross_fwd", "DecoderBlock._ffn_fwd", "DecoderBlock.backward", "DecoderBlock._back",
                   "DecoderBlock._ffn_back", "DecoderBlock._cross_back", "DecoderBlock._self_back",
                   "DecoderBlock.prefill", "DecoderBlock._self_prefill", "DecoderBlock.decode_step",
                   "DecoderBlock._rest", "DecoderBlock._sum", "DecoderBlock._cross_step", "DecoderBlock._ffn_step",
                   "Transformer.forward", "Transformer._check_tgt", "Transformer._forward",
                   "Transformer._decoder_forward", "Transformer.encode", "Transformer._check_lengths",
                   "Transformer.backward", "Transformer._decoder_back", "Transformer._encoder_back",
                   "Transformer._plan", "Transformer._logits_argmax", "Transformer._pick", "_ids"],
    "activation.py": ["ActivationLayer.forward", "ActivationLayer.backward"],
    "layer.py": ["Buffered._buffers", "train_backward"],
    "norm.py": ["LayerNorm.forward", "LayerNorm.backward", "LayerNorm._arrays", "LayerNorm._clear"],
    "embedding.py": ["Embedding.forward", "Embedding.backward"],
    "posenc.py": ["PositionalEncoding.forward", "PositionalEncoding._add", "PositionalEncoding._check_x",
                  "PositionalEncoding._run", "PositionalEncoding.backward", "PositionalEncoding.prefill",
                  "PositionalEncoding.decode_step"],
    "posembed.py": ["LearnedPositionalEmbedding.backward", "LearnedPositionalEmbedding._grad"],
    # the attention's forward/backward (masks and cross-attention included), prefill, decode_step,
    # the padded and cross-attention steps, and its projections (_Proj)
    "attention.py": ["Attention.forward", "Attention._inputs", "Attention._check_x",
                     "Attention._key_mask", "Attention._masks", "Attention._qkv",
                     "Attention._project_qkv", "Attention.backward", "Attention._check_dy", "Attention._kv_back",
                     "Attention._check_decoding", "Attention._no_lora", "Attention._adapted",
                     "_Proj.forward", "_Proj.forward_kept", "_Proj._product", "_Proj._kept", "_Proj._bias",
                     "_Proj.backward", "_Proj._back", "_Proj._back_q8", "_Proj._adapter_back", "_Proj._dweight",
                     "_Proj._dbias", "_Proj._data"],
    # the attention's masks, cross-attention's context check, dropout and per-item paths (loaded on first use)
    "attnpaths.py": ["_check_context", "_given_mask", "_mask_bytes", "_mask_row", "_lengths_mask", "_length_row",
                     "_drop_threshold", "_drop_scale", "_item", "_new_views", "_mask_item", "_attend_items",
                     "_attend_back_items", "_attend_back_stored", "_weights_item", "_heads"],
    # prefill, decode_step, the padded and cross-attention steps (loaded on first use)
    "attndecode.py": ["prefill", "_cache_shape", "_eval_forward", "_store_prompt", "decode_step", "_check_token",
                      "_decode_qkv", "cache_context", "cross_step", "_check_cross", "prefill_padded",
                      "_hide_padding", "_hide_row", "decode_step_padded", "_show_new"],
    # what a converted torch forward adds between layers (graph.py)
    "graph.py": ["SeqReduce._fmax", "SeqReduce._bmax", "Residual.forward", "Residual.backward", "Residual._add_inner", "SelectPosition.forward",
                 "SelectPosition._gather", "SelectPosition._ids", "SelectPosition.backward", "SelectPosition._scatter",
                 "PrependToken.forward", "PrependToken._place", "PrependToken.backward", "PrependToken._take",
                 "PrependToken._grad", "PrependToken._gather_tok", "PrependToken._seq_ids", "PrependToken._tok_ids",
                 "PrependToken._zero_ids", "SeqReduce.forward", "SeqReduce._fsum", "SeqReduce.backward",
                 "SeqReduce._bsum", "SeqReduce._bmax", "_rows"],
}

# on the paths and still above the limit: the attention kernels' calls (10 to 17 arguments: the
# call alone needs 12 words or more of stack; each sits alone in its method, one heap frame per
# forward, backward or decoding step) and the eval-mode forward of a prefill with dropout (its try
# block)
OVER = {
    "attention.py": ["Attention._attend", "Attention._attend_back"],
    "attnpaths.py": ["_attend_tiled", "_drop_weights", "_attend_back_tiled", "_attend_back_dropped",
                     "_attend_item", "_attend_back_item"],
    "attndecode.py": ["_decode_attend", "_decode_attend_padded", "_cross_attend", "_undropped"],
}


def _all(mod):
    return dict((name, words) for name, _, _, words in frames.frames(os.path.join(LIB, mod)))


def test_hot_paths_keep_their_frames_off_the_heap():
    over = []
    for mod, names in HOT.items():
        got = _all(mod)
        for n in names:
            assert n in got, "%s: no function %s (renamed? update HOT)" % (mod, n)
            if got[n] > frames.LIMIT:
                over.append("%s:%s (%d words)" % (mod, n, got[n]))
    assert not over, "frames above %d words on a hot path:\n  %s" % (frames.LIMIT, "\n  ".join(over))


def test_the_known_large_frames_are_listed():
    # the hot functions still above the limit are exactly OVER: a fix, or a new offender, shows here
    for mod, names in OVER.items():
        got = _all(mod)
        for n in names:
            assert n in got, "%s: no function %s (renamed? update OVER)" % (mod, n)
            assert got[n] > frames.LIMIT, "%s:%s is within %d words now: move it from OVER to HOT" % (
                mod, n, frames.LIMIT)


_PROBE = """
import micropython
def at_limit(a, b, c, d, e, f, g, h, i, j):
    return a
def over_limit(a, b, c, d, e, f, g, h, i, j, k):
    return a
def run():
    t0 = micropython.mem_total()
    for _ in range(10):
        at_limit(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    t1 = micropython.mem_total()
    for _ in range(10):
        over_limit(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    t2 = micropython.mem_total()
    print("ALLOC", t1 - t0, t2 - t1)
run()
"""


def test_the_limit_is_the_interpreters(tmp_path, micropython):
    # the tool's frame sizes and LIMIT agree with what the port allocates: a function at the
    # limit allocates nothing per call, one word more allocates a frame on every call
    p = tmp_path / "probe.py"
    p.write_text(_PROBE)
    got = dict((n, w) for n, _, _, w in frames.frames(str(p)))
    assert got["at_limit"] == frames.LIMIT and got["over_limit"] == frames.LIMIT + 1, got
    out = subprocess.run([micropython, str(p)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    at, over = [int(v) for v in out.stdout.split("ALLOC")[1].split()]
    assert at == 0, out.stdout
    assert over >= 10 * 4 * (frames.LIMIT + 1), out.stdout


def test_viper_functions_have_no_frame(tmp_path):
    p = tmp_path / "v.py"
    p.write_text("import micropython\n\n@micropython.viper\ndef k(a, b: int, c: int, d, e, f, g, h, i, j, k2, l):\n"
                 "    return b\n\ndef plain(a, b, c, d, e, f, g, h, i, j, k2, l):\n    return a\n")
    got = dict((n, w) for n, _, _, w in frames.frames(str(p)))
    assert got == {"k": 0, "plain": 13}, got


@pytest.mark.parametrize("bad", ["def f(:\n    pass\n"])
def test_a_file_that_does_not_compile_is_named(tmp_path, bad):
    p = tmp_path / "bad.py"
    p.write_text(bad)
    with pytest.raises(ValueError, match="bad.py: mpy-cross failed"):
        frames.frames(str(p))


# matmul_backward_input + matmul_backward_weight (the Dense backward's calls of few arguments)
# give matmul_backward's values bit for bit, on every backend
_SPLIT = """
import sys
from array import array
import microformer as mf
from microformer import backend
mf.set_backend(sys.argv[1])
K = backend.K
rng = mf.Rng(5)
bad = 0
for N, C, OC in ((1, 1, 1), (3, 4, 5), (16, 8, 3), (2, 33, 7)):
    def r(n):
        return array("f", [rng.uniform(-2.0, 2.0) for _ in range(n)])
    dout, inp, w = r(N * OC), r(N * C), r(OC * C)
    for bias in (0, 1):
        d1, dw1, db1 = array("f", [0.0] * (N * C)), r(OC * C), r(OC)
        d2, dw2, db2 = array("f", [0.0] * (N * C)), array("f", dw1), array("f", db1)
        K.matmul_backward(d1, dw1, db1 if bias else None, dout, inp, w, N, C, OC)
        K.matmul_backward_input(d2, dout, w, N, C, OC)
        K.matmul_backward_weight(dw2, db2 if bias else None, dout, inp, N, C, OC)
        for a, b in ((d1, d2), (dw1, dw2), (db1, db2)):
            bad += sum(1 for i in range(len(a)) if a[i] != b[i])
    db1, db2 = r(OC), None
    db2 = array("f", db1)
    K.matmul_backward(None, None, db1, dout, inp, w, N, C, OC)
    K.matmul_backward_weight(None, db2, dout, inp, N, C, OC)
    bad += sum(1 for i in range(OC) if db1[i] != db2[i])
print("SPLIT", sys.argv[1], bad)
"""


@pytest.mark.parametrize("backend", ["viper", "python"])
def test_split_backward_kernels_match_matmul_backward_mp(tmp_path, micropython, backend):
    p = tmp_path / "split.py"
    p.write_text(_SPLIT)
    out = helpers.run_micropython(p, backend, exe=micropython)
    assert "SPLIT %s 0" % backend in out, out


def test_split_backward_kernels_match_matmul_backward_numpy(tmp_path):
    p = tmp_path / "split.py"
    p.write_text(_SPLIT)
    out = helpers.run_cpython(p, "numpy")
    assert "SPLIT numpy 0" in out, out


# the viper entry points of the Dense/LayerNorm/activation/pooling/sequence path allocate nothing per call
# once their scratch has grown (micropython.mem_total counts freed heap frames too)
_ZERO = """
import micropython
from array import array
import microformer as mf
from microformer import backend
mf.set_backend("viper")
K = backend.K
N, C, OC = 16, 8, 5
def f(n):
    return array("f", [0.5 - (i % 7) * 0.1 for i in range(n)])
x, w, b, y, dy, dx, dw, db = f(N * C), f(OC * C), f(OC), f(N * OC), f(N * OC), f(N * C), f(OC * C), f(OC)
g, be, mean, rstd, ln = f(C), f(C), f(N), f(N), f(N * C)
keep = [None]
lna, lnb_a = [g, be, mean, rstd], [g, be, mean, rstd, g, be]
ids, order = array("f", [i % N for i in range(N)]), [i % N for i in range(N)]
pe, ef, eb, kv, gr = K.posenc_forward, K.embedding_forward, K.embedding_backward, K.kv_store, K.gather_rows
# each kernel bound to a global first: a lambda calling K.name(10 arguments) would need 12 words
# of stack, and its own frame would come from the heap
mf_, mfk, mb, mbi, mbw = K.matmul_forward, K.matmul_forward_kept, K.matmul_backward, K.matmul_backward_input, K.matmul_backward_weight
lnf, lnb, af, ab, pf, pb = K.layernorm_forward, K.layernorm_backward, K.act_forward, K.act_backward, K.avgpool_forward, K.avgpool_backward
calls = (
    ("matmul_forward", lambda: mf_(y, x, w, b, N, C, OC)),
    ("matmul_forward_kept", lambda: mfk(y, x, w, b, 1, C, OC, keep)),
    ("matmul_backward", lambda: mb(dx, dw, db, dy, x, w, N, C, OC)),
    ("matmul_backward_input", lambda: mbi(dx, dy, w, N, C, OC)),
    ("matmul_backward_weight", lambda: mbw(dw, db, dy, x, N, C, OC)),
    ("layernorm_forward", lambda: lnf(ln, x, lna, N, C, 1e-5)),
    ("layernorm_backward", lambda: lnb(dx, ln, x, lnb_a, N, C)),
    ("act_forward", lambda: af(ln, x, N * C, K.GELU)),
    ("act_backward", lambda: ab(dx, ln, x, ln, N * C, K.GELU)),
    ("act_backward_relu", lambda: ab(dx, ln, x, ln, N * C, K.RELU)),
    ("avgpool_forward", lambda: pf(y, x, 2, 8, C)),
    ("avgpool_backward", lambda: pb(dx, y, 2, 8, C)),
    ("posenc_forward", lambda: pe(ln, x, x, 2, 8, C, 0)),
    ("embedding_forward", lambda: ef(ln, ids, x, N, C, N)),
    ("embedding_backward", lambda: eb(dx, ln, ids, N, C)),
    ("kv_store", lambda: kv(x, y, 2, 2, 8, C, 3)),
    ("gather_rows", lambda: gr(ln, x, order, 2, 4, C)),
)
def run(fn):
    fn()
    t = micropython.mem_total()
    for _ in range(10):
        fn()
    return micropython.mem_total() - t
base = run(lambda: None)             # the lambda's own call
for name, fn in calls:
    print("BYTES", name, run(fn) - base)
"""


def test_viper_entry_points_allocate_nothing(tmp_path, micropython):
    p = tmp_path / "zero.py"
    p.write_text(_ZERO)
    out = helpers.run_micropython(p, exe=micropython)
    rows = [line.split() for line in out.splitlines() if line.startswith("BYTES ")]
    assert len(rows) == 17, out
    assert all(r[2] == "0" for r in rows), out


# the layers of the decode stack and the training step outside the attention allocate nothing
# per call at steady state (no heap frame anywhere below them; the frames of their kernels'
# entry points are checked above)
_LAYERS = """
import micropython
import microformer as mf
mf.set_backend("viper")
rng = mf.Rng(3)
def t(*shape):
    x = mf.Tensor(shape)
    for i in range(x.size):
        x.data[i] = rng.uniform(-1.0, 1.0)
    return x
ids = mf.Tensor((2, 3))
for i in range(6):
    ids.data[i] = (5 * i + 1) % 50
emb, pe, lpe, ln = mf.Embedding(50, 8), mf.PositionalEncoding(16, 8), mf.LearnedPositionalEmbedding(16, 8), mf.LayerNorm(8)
x, dy = t(2, 3, 8), t(2, 3, 8)
tok = t(2, 1, 8)
pe.prefill(x)
calls = (
    ("Embedding.forward", lambda: emb.forward(ids)),
    ("Embedding.backward", lambda: emb.backward(dy)),
    ("PositionalEncoding.forward", lambda: pe.forward(x, 2)),
    ("PositionalEncoding.backward", lambda: pe.backward(dy)),
    ("LearnedPositionalEmbedding.forward", lambda: lpe.forward(x, 1)),
    ("LearnedPositionalEmbedding.backward", lambda: lpe.backward(dy)),
    ("LayerNorm.forward", lambda: ln.forward(x)),
    ("LayerNorm.backward", lambda: ln.backward(dy)),
)
def run(fn):
    fn()
    t0 = micropython.mem_total()
    for _ in range(10):
        fn()
    return micropython.mem_total() - t0
base = run(lambda: None)
for name, fn in calls:
    print("BYTES", name, run(fn) - base)
"""


def test_sequence_layers_allocate_nothing_per_call(tmp_path, micropython):
    p = tmp_path / "layers.py"
    p.write_text(_LAYERS)
    out = helpers.run_micropython(p, exe=micropython)
    rows = [line.split() for line in out.splitlines() if line.startswith("BYTES ")]
    assert len(rows) == 8, out
    assert all(r[2] == "0" for r in rows), out
