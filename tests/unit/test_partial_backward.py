"""Backward stops where training stops, and frozen parameters hold no grad buffer.

A model with a frozen prefix is compared with the same model (same seed) trained whole: the
gradients of the parameters that train are bit for bit those of the full backward, the frozen
prefix's backward is never called, frozen parameters have no grad array, and unfreezing gives
them zeroed buffers again. Runs on the portable and NumPy backends (`backend` fixture);
tests/mp/lora_mp.py repeats the bit-identity check inside MicroPython on the viper backend.
"""
import pytest

import microformer as mf
from microformer.loss import CrossEntropyLoss

import sensor


def block_model():
    mf.seed(5)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)),
                          mf.EncoderBlock(8, 2, 12, activation="relu"),
                          mf.EncoderBlock(8, 2, 12, activation="relu"),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def _batch(shape, labels, seed=9):
    rng = mf.Rng(seed)
    x = mf.Tensor(shape)
    for i in range(x.size):
        x.data[i] = rng.uniform(-1.0, 1.0)
    return x, labels


def _step(model, x, labels):
    loss = CrossEntropyLoss()
    loss.forward(model.forward(x), labels)
    return model.backward(loss.backward())


def _count_calls(layer, calls, name):
    # wrap layer.backward (an instance attribute shadows the method) to count its calls
    inner = layer.backward

    def counted(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return inner(*a, **k)
    layer.backward = counted


def _grads(model):
    return {id(p): bytes(g.data) for p, g in model.params() if g.data is not None}


def _by_name(model):
    return [(p.name, p, g) for p, g in model.params()]


def test_head_only_backward_calls_only_the_head(backend):
    ref = sensor.build_model()
    x, y = _batch((4, 600), [0, 1, 2, 3])
    _step(ref, x, y)
    model = sensor.build_model()
    for l in model.layers[:-1]:
        l.trainable = False
    calls = {}
    for i, l in enumerate(model.layers):
        _count_calls(l, calls, i)
    _count_calls(model.layers[5].attn, calls, "attn")
    dx = _step(model, x, y)
    assert dx is None                        # the input gradient is not computed
    assert calls == {7: 1}, calls            # nothing below the head ran backward
    head = model.layers[7]
    rhead = ref.layers[7]
    assert bytes(head.dW.data) == bytes(rhead.dW.data)
    assert bytes(head.db.data) == bytes(rhead.db.data)
    for l in model.layers[:-1]:
        for p, g in l.params():
            assert g.data is None, "frozen %s keeps a grad buffer" % p.name
    assert [p for p, _ in model.parameters()] == [head.W, head.b]


@pytest.mark.parametrize("frozen", [(0,), (0, 2), (0, 1, 2), (3,)])
def test_trainable_grads_are_bit_identical(backend, frozen):
    x, y = _batch((5, 4), [0, 1, 2, 1, 0])
    ref = block_model()
    _step(ref, x, y)
    model = block_model()
    for i in frozen:
        model.layers[i].trainable = False
    calls = {}
    for i, l in enumerate(model.layers):
        _count_calls(l, calls, i)
    _step(model, x, y)
    lowest = min(i for i in range(len(model.layers)) if i not in frozen and model.layers[i].params())
    assert sorted(calls) == list(range(lowest, len(model.layers))), calls
    live = 0
    for (name, p, g), (_, rp, rg) in zip(_by_name(model), _by_name(ref)):
        if g.data is None:
            continue
        live += 1
        assert bytes(g.data) == bytes(rg.data), "grad of %s differs from the full backward's" % name
    assert live == len(model.parameters()) and live > 0
    frozen_params = [p for i in frozen for p, _ in model.layers[i].params()]
    assert all(g.data is None for p, g in model.params() if any(p is q for q in frozen_params))


def test_block_part_frozen_skips_attention_backward(backend):
    # in the lowest trainable block only the FFN trains: the attention below it never runs backward
    x, y = _batch((5, 4), [0, 1, 2, 1, 0])
    ref = block_model()
    _step(ref, x, y)
    model = block_model()
    model.layers[0].trainable = False
    model.layers[2].trainable = False
    blk = model.layers[3]
    blk.attn.trainable = False
    blk.ln1.trainable = False
    calls = {}
    for name in ("attn", "ln1", "ffn", "ln2"):
        _count_calls(getattr(blk, name), calls, name)
    _count_calls(blk.ffn.fc1, calls, "fc1")
    _step(model, x, y)
    assert calls == {"ffn": 1, "ln2": 1, "fc1": 1}, calls
    for (name, p, g), (_, rp, rg) in zip(_by_name(model), _by_name(ref)):
        if g.data is not None:
            assert bytes(g.data) == bytes(rg.data), name
    # fc1 is the lowest trainable part and nothing needs its input gradient
    model2 = block_model()
    for i in (0, 2):
        model2.layers[i].trainable = False
    b2 = model2.layers[3]
    for part in (b2.attn, b2.ln1, b2.ln2, b2.ffn.fc2):
        part.trainable = False
    seen = []
    inner = b2.ffn.fc1.backward
    b2.ffn.fc1.backward = lambda dy, grads=True, need_dx=True: seen.append(need_dx) or inner(dy, grads, need_dx)
    _step(model2, x, y)
    assert seen == [False]
    # only fc2 trains (fc1, the norms and the attention frozen): fc1 gets no backward at all
    model3 = block_model()
    for i in (0, 2):
        model3.layers[i].trainable = False
    b3 = model3.layers[3]
    for part in (b3.attn, b3.ln1, b3.ln2, b3.ffn.fc1):
        part.trainable = False
    calls3 = {}
    for name in ("fc1", "fc2"):
        _count_calls(getattr(b3.ffn, name), calls3, name)
    _step(model3, x, y)
    assert calls3 == {"fc2": 1}, calls3
    assert bytes(b3.ffn.fc2.dW.data) == bytes(ref.layers[3].ffn.fc2.dW.data)


def test_need_dx_true_gives_the_full_input_gradient(backend):
    x, y = _batch((5, 4), [0, 1, 2, 1, 0])
    ref = block_model()
    rdx = bytes(_step(ref, x, y).data)
    model = block_model()
    model.layers[0].trainable = False
    loss = CrossEntropyLoss()
    loss.forward(model.forward(x), y)
    assert model.backward(loss.backward()) is None          # default: stops at layer 2
    loss.forward(model.forward(x), y)
    dx = model.backward(loss.backward(), need_dx=True)
    assert bytes(dx.data) == rdx


def test_unfreeze_gives_zeroed_buffers_and_trains_again(backend):
    x, y = _batch((5, 4), [0, 1, 2, 1, 0])
    model = block_model()
    blk = model.layers[2]
    blk.trainable = False
    assert all(g.data is None for _, g in blk.params())
    opt = mf.Adam(model, lr=1e-2)
    n_frozen = len(opt.params)
    blk.trainable = True
    assert all(g.data is not None and not any(g.data) for _, g in blk.params())
    ref = block_model()
    _step(ref, x, y)
    _step(model, x, y)
    assert _grads(model) == {id(p): bytes(g.data) for p, g in model.params()}
    for (name, p, g), (_, rp, rg) in zip(_by_name(model), _by_name(ref)):
        assert bytes(g.data) == bytes(rg.data), name
    opt2 = mf.Adam(model, lr=1e-2)
    assert len(opt2.params) > n_frozen
    before = bytes(blk.attn.Wq.data)
    opt2.step()
    assert bytes(blk.attn.Wq.data) != before


def test_optimizer_refuses_frozen_pairs():
    model = block_model()
    model.layers[0].trainable = False
    with pytest.raises(ValueError, match=r"param 0 \(W\) is frozen"):
        mf.Adam(model.params(), lr=1e-2)
    opt = mf.Adam(model, lr=1e-2)
    model.layers[5].trainable = False          # frozen after the optimizer was made
    with pytest.raises(ValueError, match=r"Adam: 5\.W was frozen after the optimizer was made"):
        opt.step()
    with pytest.raises(ValueError, match="frozen after the optimizer was made"):
        opt.zero_grad()


def test_trainable_must_be_a_bool():
    d = mf.Dense(2, 2)
    with pytest.raises(ValueError, match="trainable must be True or False, got 0"):
        d.trainable = 0


def test_summary_counts_grads_of_trainable_parameters_only():
    model = block_model()
    full = model.summary((5, 4), show=False)
    for l in model.layers[:-1]:
        l.trainable = False
    head = model.summary((5, 4), show=False)
    n_head = model.layers[-1].param_count()
    assert head["params"] == full["params"]
    assert head["trainable"] == n_head
    # weights of every parameter; grads and 2 Adam slots of trainable ones; the step's scratch
    # (1 + 2) of a group of trainable tensors: all of the head's, 1024 floats (optim.GROUP, as
    # documented) of the whole model's
    assert n_head < 1024 < full["params"]
    assert head["param_bytes"] == 4 * (head["params"] + n_head * (1 + 2) + n_head * (1 + 2))
    assert full["snapshot_bytes"] == 4 * 1024 * (1 + 2)
    assert full["param_bytes"] == 4 * full["params"] * (2 + 2) + full["snapshot_bytes"]


def _seq2seq():
    mf.seed(12)
    return mf.Transformer(11, 13, 8, 2, 12, num_encoder_layers=2, num_decoder_layers=2)


def _seq_step(model):
    src = mf.Tensor.from_list([[1, 2, 3, 4], [5, 6, 7, 8]])
    tgt = mf.Tensor.from_list([[0, 3, 2], [0, 1, 9]])
    loss = CrossEntropyLoss()
    logits = model.forward(src, tgt)
    loss.forward(logits.reshape(6, 13), [3, 2, 1, 1, 9, 4])
    model.backward(mf.Tensor(logits.shape, loss.backward().data))


@pytest.mark.parametrize("frozen, runs", [
    # what is frozen (attribute paths), which parts must run backward
    ((("src_embed",), ("encoder", 0), ("tgt_embed",)),
     {"generator", "dec1", "dec0", "enc1"}),
    ((("src_embed",), ("encoder", 0), ("encoder", 1), ("enc_norm",), ("tgt_embed",), ("decoder", 0)),
     {"generator", "dec1"}),
    ((("src_embed",), ("encoder",), ("enc_norm",), ("tgt_embed",), ("decoder",), ("dec_norm",)),
     {"generator"}),
])
def test_transformer_stops_where_training_stops(backend, frozen, runs):
    ref = _seq2seq()
    _seq_step(ref)
    model = _seq2seq()
    for path in frozen:
        obj = getattr(model, path[0])
        if len(path) == 1 and isinstance(obj, list):
            for part in obj:
                part.trainable = False
            continue
        (obj[path[1]] if len(path) == 2 else obj).trainable = False
    calls = {}
    _count_calls(model.generator, calls, "generator")
    for i in range(2):
        _count_calls(model.decoder[i], calls, "dec%d" % i)
        _count_calls(model.encoder[i], calls, "enc%d" % i)
    _count_calls(model.src_embed, calls, "src_embed")
    _count_calls(model.tgt_embed, calls, "tgt_embed")
    _seq_step(model)
    assert set(calls) == runs, calls
    live = 0
    for (p, g), (_, rg) in zip(model.params(), ref.params()):
        if g.data is None:
            continue
        live += 1
        assert bytes(g.data) == bytes(rg.data), "grad of %s differs from the full backward's" % p.name
    assert live == len(model.parameters()) > 0


def test_a_frozen_nested_sequential_still_passes_the_gradient_down(backend):
    # a composite of one's own calls part.backward(dy, False) on a frozen part and uses dx
    x, y = _batch((5, 4), [0, 1, 2, 1, 0])
    def make():
        mf.seed(7)
        return mf.Sequential([mf.Dense(4, 6), mf.Sequential([mf.Dense(6, 6), mf.ActivationLayer("tanh")]),
                              mf.Dense(6, 3)])
    model = make()
    inner = model.layers[1]
    ref = make()
    _step(ref, x, y)
    inner.trainable = False
    loss = CrossEntropyLoss()
    loss.forward(model.forward(x), y)
    dy = model.layers[2].backward(loss.backward())
    dx = inner.backward(dy, False)
    assert dx is not None and bytes(dx.data) == bytes(ref.layers[1].layers[0]._dx.data)
    assert inner.backward(dy, False, False) is None
