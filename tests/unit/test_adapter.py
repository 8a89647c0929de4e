"""Adapted models in specs and checkpoints, and adapter checkpoints (microformer.checkpoint
save_adapter / load_adapter), on CPython.

- to_spec / from_spec / load_model round-trip a LoRA-adapted model bit for bit, and specplan plans
  exactly the tensors an adapted model of every adaptable layer type holds;
- an adapter file holds only the trained tensors, names its base by CRC and refuses another base;
- its size against the full checkpoint, for the sensor model and a two-EncoderBlock E=64 model.
"""
import os

import pytest

import microformer as mf
from microformer import checkpoint as ck
from microformer import lora as L
from microformer import specplan as mspec

import sensor


def _bits(model):
    return [(n, bytes(p.data)) for n, p in ck._named(model)]


def _block_model():
    mf.seed(6)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)), mf.EncoderBlock(8, 2, 12),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def _train(model, seed=30):
    # stands for a fine-tune: every adapter's B (zero when new) gets values
    for i, (_, a) in enumerate(L.adapters(model)):
        mf.seed(seed + i)
        B = mf.Tensor.randn(a.B.shape) if hasattr(mf.Tensor, "randn") else None
        for j in range(len(a.B.data)):
            a.B.data[j] = ((j * 7 + i * 3) % 11 - 5) * 0.01 if B is None else B.data[j] * 0.1


ADAPTABLE = [
    {"type": "Dense", "in_features": 3, "out_features": 5},
    {"type": "Attention", "embed_dim": 6, "num_heads": 2},
    {"type": "FeedForward", "embed_dim": 4, "hidden": 6},
    {"type": "EncoderBlock", "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6},
    {"type": "DecoderBlock", "embed_dim": 4, "num_heads": 2, "ffn_hidden": 5, "use_bias": False},
    {"type": "Transformer", "src_vocab": 7, "tgt_vocab": 5, "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6,
     "num_encoder_layers": 2, "num_decoder_layers": 1},
]


# the blocks and FeedForward as parts of a Sequential (their adapters' names carry the index)
_TOP = [ADAPTABLE[0], ADAPTABLE[1], ADAPTABLE[5], {"type": "Sequential", "layers": ADAPTABLE[:5]}]


@pytest.mark.parametrize("spec", _TOP, ids=[s["type"] for s in _TOP])
def test_planned_adapter_tensors_are_the_models_own(spec):
    model = mf.from_spec(spec)
    L.add_lora(model, rank=2, alpha=4, targets=("*",))          # every linear map
    real = sorted((n, tuple(p.shape)) for n, p in ck._named(model))
    got = mf.to_spec(model)
    assert "lora" in got
    assert sorted(mspec.named_shapes(got)) == real
    assert mspec.plan(got)[0] == sum(len(p.data) for _, p in ck._named(model))
    again = mf.from_spec(got)       # rebuilt: the same tensors, adapters trainable, base frozen
    assert sorted((n, tuple(p.shape)) for n, p in ck._named(again)) == real
    assert L.trainable_count(again) == L.trainable_count(model) == sum(
        a.A.size + a.B.size for _, a in L.adapters(model))


def test_adapted_model_round_trips_through_a_checkpoint_bit_for_bit(tmp_path):
    model = _block_model()
    L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn"))
    L.add_lora(model, rank=3, alpha=6, targets=("4",))         # two ranks: two spec entries
    _train(model)
    spec = mf.to_spec(model)
    assert [(g["rank"], g["alpha"], len(g["targets"])) for g in spec["lora"]] == [(2, 4, 6), (3, 6, 1)]
    path = str(tmp_path / "lora.mfck")
    mf.save_checkpoint(path, model)
    again = mf.load_model(path)
    assert _bits(again) == _bits(model)
    x = mf.Tensor.from_list([[0.1 * i - 0.3 * j for i in range(4)] for j in range(3)])
    assert bytes(again.forward(x).data) == bytes(model.forward(x).data)
    # a plain model of the same layers is refused, naming the difference
    with pytest.raises(mf.CheckpointError, match="lora"):
        mf.load_checkpoint(path, _block_model())


def test_a_spec_naming_no_linear_map_is_refused():
    spec = mf.to_spec(_block_model())
    spec["lora"] = [{"rank": 2, "alpha": 4, "targets": ["2.self_attn.x_proj"]}]
    with pytest.raises(ValueError, match="x_proj"):
        mspec.plan(spec)
    spec["lora"] = [{"rank": 0, "alpha": 4, "targets": ["4"]}]
    with pytest.raises(ValueError, match="rank"):
        mf.from_spec(spec)


def _base(tmp_path, name="base.mfck"):
    model = _block_model()
    path = str(tmp_path / name)
    mf.save_checkpoint(path, model, meta={"classes": ["a", "b", "c"]})
    return model, path


def test_adapter_file_reloads_base_plus_adapter_bit_for_bit(tmp_path):
    model, base = _base(tmp_path)
    L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn"))
    model[-1].trainable = True                                  # the head trains too
    _train(model)
    for i in range(len(model[-1].W.data)):
        model[-1].W.data[i] += 0.01 * i
    apath = str(tmp_path / "model.adapter.mfck")
    ck.save_adapter(apath, model, base)
    meta, tensors = ck.read(apath)
    trained = sorted(n for n, p in ck._named(model) if any(p is q for q, _ in model.collect_params([])))
    assert sorted(n for n, _, _ in tensors) == trained
    assert meta["adapter_of"]["crc"] == int.from_bytes(open(base, "rb").read()[-4:], "little")
    fresh = mf.load_model(base)
    ck.load_adapter(apath, fresh, base)
    assert sorted(_bits(fresh)) == sorted(_bits(model))
    # into a model that has the adapters already: the same
    other = _block_model()
    L.add_lora(other, rank=2, alpha=4, targets=("attention", "ffn"))
    ck.load_adapter(apath, other, base)
    assert sorted(_bits(other)) == sorted(_bits(model))


def test_adapter_file_refuses_another_base(tmp_path):
    model, base = _base(tmp_path)
    L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn"))
    _train(model)
    apath = str(tmp_path / "a.mfck")
    ck.save_adapter(apath, model, base)
    other_model = _block_model()
    other_model[0].W.data[0] += 1.0
    other = str(tmp_path / "other.mfck")
    mf.save_checkpoint(other, other_model, meta={"classes": ["a", "b", "c"]})
    fresh = _block_model()
    before = _bits(fresh)
    crc_a = "0x%08x" % ck.base_id(base)["crc"]
    crc_b = "0x%08x" % ck.base_id(other)["crc"]
    with pytest.raises(mf.CheckpointError, match="expected base CRC %s.*CRC %s" % (crc_a, crc_b)):
        ck.load_adapter(apath, fresh, other)
    assert _bits(fresh) == before                               # untouched
    with pytest.raises(mf.CheckpointError, match="not an adapter"):
        ck.load_adapter(base, fresh, base)


def _two_blocks():
    # the larger encoder classifier of the budget measurements: E=64, H=4, S=32, about 100k parameters
    mf.seed(3)
    E = 64
    return mf.Sequential([mf.Dense(16, E), mf.LearnedPositionalEmbedding(32, E),
                          mf.EncoderBlock(E, 4, 4 * E), mf.EncoderBlock(E, 4, 4 * E),
                          mf.GlobalAvgPool(), mf.Dense(E, 4)])


# the sensor model is 16 wide: an r=4 adapter on a 16x16 projection holds half the matrix's
# floats (4 * (16 + 16) = 128 of 256), so its adapter file is about a third of the checkpoint;
# the 10 % goal holds from E=64 (two blocks: 4 * 128 of 4096 per projection)
@pytest.mark.parametrize("which,limit", [("sensor", 0.35), ("two_blocks", 0.10)])
def test_adapter_file_size_against_the_checkpoint(tmp_path, which, limit):
    model = sensor.build_model() if which == "sensor" else _two_blocks()
    base = str(tmp_path / "base.mfck")
    full = mf.save_checkpoint(base, model)
    L.add_lora(model, rank=4, alpha=8, targets=("attention", "ffn"))
    apath = str(tmp_path / "a.mfck")
    small = ck.save_adapter(apath, model, base)
    assert small == os.path.getsize(apath)
    print("ADAPTER %s: checkpoint %d bytes, adapter r=4 attention+ffn %d bytes (%.1f %%), %d of %d parameters"
          % (which, full, small, 100.0 * small / full, L.trainable_count(model),
             sum(len(p.data) for _, p in ck._named(model))))
    assert small <= limit * full
