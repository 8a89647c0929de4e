"""backward has one return type: the gradient of the (first) input as a Tensor shaped as that
input, or None where there is none (token ids; need_dx=False). A second input's gradient is an
attribute set by backward: Attention.dcontext (None for self-attention), DecoderBlock.dmemory."""
import helpers  # noqa: F401  (the import path)
import microformer as mf
from microformer import Tensor


def _x(shape, seed):
    rng = mf.Rng(seed)
    t = Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(-1.0, 1.0)
    return t


def test_self_and_cross_attention():
    mf.seed(1)
    a = mf.Attention(8, 2)
    x, c = _x((2, 3, 8), 1), _x((2, 5, 8), 2)
    a.forward(x, context=c)
    dx = a.backward(_x((2, 3, 8), 3))
    assert isinstance(dx, Tensor) and dx.shape == (2, 3, 8)
    assert isinstance(a.dcontext, Tensor) and a.dcontext.shape == (2, 5, 8)
    assert any(v != 0.0 for v in a.dcontext.data)
    a.forward(x)
    dx = a.backward(_x((2, 3, 8), 3))
    assert isinstance(dx, Tensor) and dx.shape == (2, 3, 8) and a.dcontext is None
    a.forward(x)
    assert a.backward(_x((2, 3, 8), 3), True, False) is None


def test_decoder_block_and_token_inputs():
    mf.seed(2)
    blk = mf.DecoderBlock(8, 2, 12)
    x, m = _x((2, 3, 8), 4), _x((2, 4, 8), 5)
    blk.forward(x, m)
    dx = blk.backward(_x((2, 3, 8), 6))
    assert isinstance(dx, Tensor) and dx.shape == (2, 3, 8)
    assert isinstance(blk.dmemory, Tensor) and blk.dmemory.shape == (2, 4, 8)
    blk.forward(x, m)
    assert blk.backward(_x((2, 3, 8), 6), True, False) is None and blk.dmemory.shape == (2, 4, 8)
    e = mf.Embedding(7, 8)
    e.forward(Tensor.from_list([[1, 2, 3]]))
    assert e.backward(_x((1, 3, 8), 7)) is None


def test_plain_layers_return_a_tensor_shaped_as_the_input():
    mf.seed(3)
    for layer, shape in ((mf.Dense(8, 4), (2, 8)), (mf.LayerNorm(8), (2, 3, 8)), (mf.GlobalAvgPool(), (2, 3, 8)),
                         (mf.EncoderBlock(8, 2, 12), (2, 3, 8)), (mf.Reshape((2, 4)), (2, 8))):
        y = layer.forward(_x(shape, 8))
        dx = layer.backward(_x(y.shape, 9))
        assert isinstance(dx, Tensor) and dx.shape == shape, type(layer).__name__
