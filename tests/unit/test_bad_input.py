"""Every public entry point refuses bad input with a message naming the thing and expected vs received."""
import pytest

import helpers  # noqa: F401
import microformer as mf
from microformer.data import Dataset, Batches


def _x(*shape):
    return mf.Tensor(shape)


@pytest.mark.parametrize("layer,x,words", [
    (lambda: mf.Dense(4, 3), _x(2, 5), ["Dense", "[N,4]", "(2, 5)"]),
    (lambda: mf.Dense(4, 3), _x(4), ["Dense", "(4,)"]),
    (lambda: mf.Attention(8, 2), _x(16, 4, 6), ["Attention", "[B,S,8]", "(16, 4, 6)"]),
    (lambda: mf.Attention(8, 2), _x(4, 8), ["Attention", "[B,S,8]", "(4, 8)"]),
    (lambda: mf.GlobalAvgPool(), _x(2, 8), ["GlobalAvgPool", "[B,S,E]", "(2, 8)"]),
    (lambda: mf.Reshape((4, 8)), _x(2, 30), ["Reshape", "(2, 30)"]),
])
def test_wrong_shape_names_layer_and_shapes(layer, x, words):
    with pytest.raises(ValueError) as e:
        layer().forward(x)
    for w in words:
        assert w in str(e.value)


def test_not_a_tensor():
    with pytest.raises(ValueError, match="Dense: x must be a Tensor, got list"):
        mf.Dense(2, 2).forward([[1.0, 2.0]])


@pytest.mark.parametrize("make,words", [
    (lambda: mf.Attention(8, 3), ["Attention", "divisible", "num_heads=3"]),
    (lambda: mf.Attention(8, 0), ["Attention", "num_heads=0"]),
    (lambda: mf.Dense(0, 3), ["Dense", "in_features", "0"]),
    (lambda: mf.ActivationLayer("swish"), ["ActivationLayer", "relu", "'swish'"]),
    (lambda: mf.Reshape((4, 0)), ["Reshape", "(4, 0)"]),
    (lambda: mf.Adam(mf.Dense(2, 2), lr=-1), ["Adam", "lr", "-1"]),
    (lambda: mf.Adam(mf.Dense(2, 2), betas=(0.9, 1.5)), ["Adam", "betas"]),
    (lambda: mf.SGD(mf.Dense(2, 2), lr=0.1, momentum=-0.5), ["SGD", "momentum"]),
    (lambda: mf.SGD([(mf.Tensor((2,)), mf.Tensor((3,)))], lr=0.1), ["SGD", "pairs"]),
    (lambda: mf.set_backend("cuda"), ["set_backend", "'python', 'viper', 'numpy' or 'native'", "'cuda'"]),
    (lambda: mf.Sequential([mf.Dense(2, 2), "relu"]), ["Sequential", "layer 1"]),
    (lambda: mf.Tensor((2, 3), [1.0, 2.0]), ["Tensor", "2 values", "6"]),
    (lambda: mf.Tensor((2, 3)).reshape(4, 2), ["reshape", "(2, 3)", "(4, 2)"]),
])
def test_bad_construction(make, words):
    with pytest.raises(ValueError) as e:
        make()
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("layer,x", [
    (mf.Dense(4, 3), _x(2, 4)), (mf.Attention(8, 2), _x(1, 3, 8)), (mf.GlobalAvgPool(), _x(2, 3, 4)),
    (mf.ActivationLayer("gelu"), _x(2, 3)), (mf.Reshape((2, 2)), _x(3, 4)),
])
def test_backward_before_forward(layer, x):
    with pytest.raises(RuntimeError, match="backward\\(\\) called before forward\\(\\)"):
        layer.backward(x)


def test_backward_wrong_dy_shape():
    d = mf.Dense(4, 3)
    d.forward(_x(2, 4))
    with pytest.raises(ValueError, match=r"Dense: dy must be \(2, 3\), got \(2, 4\)"):
        d.backward(_x(2, 4))


def test_loss_rejects_bad_labels():
    logits = mf.Tensor.from_list([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    f = mf.CrossEntropyLoss()
    with pytest.raises(ValueError, match=r"labels must be ints in \[0, 3\), got 3 at index 1"):
        f.forward(logits, [0, 3])
    with pytest.raises(ValueError, match=r"labels must be ints in \[0, 3\), got -1"):
        f.forward(logits, [-1, 0])
    with pytest.raises(ValueError, match="labels must have B=2 entries, got 1"):
        f.forward(logits, [0])
    with pytest.raises(RuntimeError, match="before forward"):
        mf.CrossEntropyLoss().backward()


def test_mask_and_context_errors():
    a = mf.Attention(8, 2)
    x = _x(2, 4, 8)
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[B,Sk\] = \[2,4\]"):
        a.forward(x, key_padding_mask=[[0, 0, 0, 0]])
    with pytest.raises(ValueError, match="key_padding_mask row 1 must have 4 entries"):
        a.forward(x, key_padding_mask=[[0, 0, 0, 0], [0, 0]])
    with pytest.raises(ValueError, match=r"Attention: context must be \[B,S,8\], got \(2, 5, 4\)"):
        a.forward(x, context=_x(2, 5, 4))


def test_non_finite_loss_is_refused_and_weights_untouched():
    mf.seed(3)
    model = mf.Sequential([mf.Dense(2, 3)])
    opt = mf.SGD(model, lr=0.1)
    before = list(model[0].W.data)
    x = mf.Tensor.from_list([[float("nan"), 1.0]])
    from microformer.train import train_step
    with pytest.raises(mf.NonFiniteError, match="Sequential: example 0, feature 0 is nan"):
        train_step(model, mf.CrossEntropyLoss(), opt, x, [1])
    assert list(model[0].W.data) == before
    with pytest.raises(mf.NonFiniteLossError):
        mf.MSELoss().forward(mf.Tensor.from_list([float("inf")]), mf.Tensor.from_list([0.0]))


def test_data_errors(tmp_path):
    with pytest.raises(ValueError, match=r"Dataset: X must be \[N,F\] with N = len\(y\) = 3"):
        Dataset(_x(2, 4), [0, 1, 2])
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        Batches(Dataset(_x(2, 4), [0, 1]), 0)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,label\n1,2,x\n1,y\n")
    from microformer.data import read_csv
    with pytest.raises(ValueError, match="line 3 has 2 fields, expected 3"):
        read_csv(str(bad))
