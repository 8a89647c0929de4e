"""layer.release_buffers (what a failed fit gives back, train.Trainer.release) drops every buffer
a pass made, its byte buffers included (Attention's key-padding bytes, a dropout's kept-mask): a
layer keeps its parameters and grads only, and the next pass makes the buffers again."""
import microformer as mf
from microformer.layer import release_buffers


def _held(layer):
    # the private Tensor and byte-buffer attributes a layer holds besides its parameters and grads
    own = set()
    for p, g in layer.params():
        own.add(id(p))
        own.add(id(g))
    return sorted(k for k, v in layer.__dict__.items()
                  if k[0] == "_" and isinstance(v, (mf.Tensor, bytearray)) and id(v) not in own)


def test_a_released_attention_holds_no_buffer():
    mf.seed(4)
    a = mf.Attention(8, 2, dropout=0.5)
    x = mf.Tensor.zeros((3, 4, 8))
    for i in range(x.size):
        x.data[i] = ((i * 5) % 7 - 3) * 0.1
    a.train()
    a.forward(x, lengths=[4, 2, 3])
    a.backward(mf.Tensor.zeros(x.shape))
    assert "_mbuf" in _held(a) and "_keep" in _held(a)      # the pass made byte buffers
    release_buffers(a)
    assert _held(a) == []
    a.eval()                                                # the next pass makes them again
    assert a.forward(x, lengths=[4, 2, 3]).shape == (3, 4, 8) and len(a._mbuf) == 12
