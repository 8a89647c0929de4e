"""microformer.parts, the one implementation of choosing a model's parameters by kind, name,
prefix, glob or layer index and freezing them (the board session's s.parts/freeze/unfreeze use
it): names are PyTorch's state_dict names, kinds follow the layers, a selection that names
nothing is refused with the valid names, nothing changes before every selection is checked,
and apply() sets the layers' trainable flags and gives the trainer what to leave out."""
import pytest

import microformer as mf
from microformer import parts as P


def encoder_model():
    # Dense stem, a PyTorch-style encoder layer (E=8, 2 heads, FFN 16), a LayerNorm, the head
    return mf.Sequential([mf.Dense(4, 8), mf.EncoderBlock(8, 2, 16), mf.LayerNorm(8), mf.Dense(8, 2)])


def names(parts):
    return [p.name for p in parts]


def test_names_shapes_and_kinds_follow_the_layers():
    model = encoder_model()
    parts = P.model_parts(model)
    # nn.TransformerEncoderLayer's state_dict names under index 1, nn.Linear / nn.LayerNorm's
    # weight and bias elsewhere
    assert names(parts) == [
        "0.weight", "0.bias",
        "1.self_attn.in_proj_weight", "1.self_attn.in_proj_bias",
        "1.self_attn.out_proj.weight", "1.self_attn.out_proj.bias",
        "1.linear1.weight", "1.linear1.bias", "1.linear2.weight", "1.linear2.bias",
        "1.norm1.weight", "1.norm1.bias", "1.norm2.weight", "1.norm2.bias",
        "2.weight", "2.bias", "3.weight", "3.bias"]
    by = dict((p.name, p) for p in parts)
    assert by["1.self_attn.in_proj_weight"].shape() == [3 * 8, 8]       # Wq, Wk, Wv stacked
    assert by["1.linear1.weight"].shape() == [16, 8]
    assert sum(p.size for p in parts) == model.param_count()
    assert sum(p.size for p in parts) == (4 * 8 + 8) + (3 * 8 * 8 + 3 * 8 + 8 * 8 + 8) + \
        (16 * 8 + 16 + 8 * 16 + 8) + 4 * 8 + 2 * 8 + (8 * 2 + 2)
    assert by["0.weight"].kinds == ["input"]
    assert by["0.bias"].kinds == ["input", "bias"]
    assert "attention" in by["1.self_attn.out_proj.weight"].kinds
    assert "ffn" in by["1.linear2.weight"].kinds and "attention" not in by["1.linear2.weight"].kinds
    assert "norm" in by["1.norm1.weight"].kinds and "bias" in by["1.norm1.weight"].kinds
    assert by["3.weight"].kinds == ["head"]
    assert [p.top for p in parts] == [0, 0] + [1] * 12 + [2, 2, 3, 3]


@pytest.mark.parametrize("sel, want", [
    ("head", ["3.weight", "3.bias"]),
    ("input", ["0.weight", "0.bias"]),
    ("embed", ["0.weight", "0.bias"]),                     # the old name of 'input'
    ("ffn", ["1.linear1.weight", "1.linear1.bias", "1.linear2.weight", "1.linear2.bias"]),
    ("1.self_attn", ["1.self_attn.in_proj_weight", "1.self_attn.in_proj_bias",
                     "1.self_attn.out_proj.weight", "1.self_attn.out_proj.bias"]),
    ("1.norm2", ["1.norm2.weight", "1.norm2.bias"]),        # a prefix ends at a dot ...
    ("1.norm", None),                                       # ... so this one names nothing
    ("*.bias", ["0.bias", "1.self_attn.out_proj.bias", "1.linear1.bias",     # not in_proj_bias:
                "1.linear2.bias", "1.norm1.bias", "1.norm2.bias", "2.bias", "3.bias"]),  # no dot
    ("1.linear?.weight", ["1.linear1.weight", "1.linear2.weight"]),
    (2, ["2.weight", "2.bias"]),
    (-1, ["3.weight", "3.bias"]),
])
def test_a_selection_names_these_parts(sel, want):
    model = encoder_model()
    parts = P.model_parts(model)
    if want is None:
        with pytest.raises(ValueError) as e:
            P.select(parts, model, sel, "freeze")
        assert "freeze: unknown part '1.norm'" in str(e.value) and "1.norm1.weight" in str(e.value)
    else:
        assert names(P.select(parts, model, sel, "freeze")) == want


@pytest.mark.parametrize("sel, words", [
    (7, "layer index 7 out of range (the model has layers 0..3)"),
    ("attention2", "unknown part 'attention2'"),
    ("embedding", "this model has no 'embedding' parameters"),
    (1.5, "a part must be a str or a layer index, got 1.5"),
    ("", "a part must be a str or a layer index"),
    (True, "a part must be a str or a layer index, got True"),
])
def test_a_selection_that_names_nothing_is_refused_with_what_is_valid(sel, words):
    model = encoder_model()
    parts = P.model_parts(model)
    with pytest.raises(ValueError) as e:
        P.select(parts, model, sel, "unfreeze")
    assert str(e.value).startswith("unfreeze: ") and words in str(e.value), str(e.value)
    if isinstance(sel, str) and sel:        # what is valid: the kinds this model has (no 'embedding')
        assert ("valid: kinds 'attention', 'norm', 'ffn', 'head', 'input', 'bias', 'all'; a layer index "
                "0..3; a name, a prefix or a glob of 0.weight, 0.bias, 1.self_attn.in_proj_weight") in str(e.value)


def test_a_layer_without_parameters_is_refused_by_index():
    model = mf.Sequential([mf.Dense(4, 8), mf.ActivationLayer("relu"), mf.Dense(8, 2)])
    with pytest.raises(ValueError) as e:
        P.select(P.model_parts(model), model, 1, "freeze")
    assert "layer 1 (ActivationLayer) has no parameters; layers with parameters: 0 Dense, 2 Dense" in str(e.value)


def test_freeze_checks_every_selection_before_it_changes_anything():
    model = encoder_model()
    parts = P.model_parts(model)
    before = {"3.bias": 1}
    with pytest.raises(ValueError):
        P.freeze(parts, model, ["input", "no.such"], before)
    assert before == {"3.bias": 1}
    frozen, changed = P.freeze(parts, model, ["input", "head"], before)
    assert before == {"3.bias": 1}                                  # a new dict; the old one stays
    assert sorted(frozen) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert names(changed) == ["0.weight", "0.bias", "3.weight"]    # 3.bias was frozen already
    frozen, changed = P.freeze(parts, model, ["*.weight"], frozen, flag=True, who="unfreeze")
    assert sorted(frozen) == ["0.bias", "3.bias"] and names(changed) == ["0.weight", "3.weight"]
    frozen, changed = P.freeze(parts, model, (), frozen, flag=True, who="unfreeze")   # none: 'all'
    assert frozen == {} and names(changed) == ["0.bias", "3.bias"]


def test_apply_freezes_whole_layers_and_excludes_the_tensors_of_partly_frozen_ones():
    model = encoder_model()
    parts = P.model_parts(model)
    frozen, _ = P.freeze(parts, model, ["input", "3.bias"], {})
    exclude = P.apply(parts, frozen)
    stem, head = model.layers[0], model.layers[3]
    assert stem.trainable is False                  # every parameter of it frozen: the layer is
    assert head.trainable is True                   # its weight still trains ...
    want = set(id(t) for p in parts if p.name in ("0.weight", "0.bias", "3.bias") for t in p.tensors)
    assert set(exclude) == want                     # ... and the optimizer leaves its bias out
    n, frozen_names = P.trainable(parts, frozen)
    assert frozen_names == ["0.weight", "0.bias", "3.bias"]
    assert n == model.param_count() - (4 * 8 + 8) - 2
    exclude = P.apply(parts, {})                   # unfrozen again
    assert exclude == {} and stem.trainable is True


def test_glob():
    assert P.glob("*.bias", "1.self_attn.out_proj.bias") and P.glob("*_bias", "1.self_attn.in_proj_bias")
    assert not P.glob("*.bias", "1.self_attn.in_proj_bias") and not P.glob("*.bias", "1.bias.weight")
    assert P.glob("?.weight", "3.weight") and not P.glob("?.weight", "13.weight")
    assert P.glob("*", "") and not P.glob("", "x")
