"""Attention's stored-weights backward goes item by item only when the batch's [B,H,S,Sk] weights
are large (Attention._back_items floats): a small block (Iris: [16,2,4,4]) is one kernel call, a
kernel call per item costing more than the block saves; a large one is one call per item."""
import microformer as mf
from microformer import backend


def _calls(B, S, E, H, monkeypatch):
    mf.set_backend("python")
    K = backend.K
    n = [0]
    f = K.attention_backward

    def counted(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH):
        n[0] += 1
        return f(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH)
    monkeypatch.setattr(K, "attention_backward", counted)
    mf.seed(3)
    a = mf.Attention(E, H)
    x = mf.Tensor((B, S, E))
    for i in range(x.size):
        x.data[i] = ((i * 7) % 13) / 13.0 - 0.5
    y = a.forward(x)
    a.backward(y)
    return n[0]


def test_a_small_block_is_one_call_a_large_one_goes_item_by_item(monkeypatch):
    assert 16 * 2 * 4 * 4 <= mf.Attention._back_items < 3 * 4 * 32 * 32
    try:
        assert _calls(16, 4, 8, 2, monkeypatch) == 1          # Iris's attention: one call
        assert _calls(3, 32, 16, 4, monkeypatch) == 3         # 12,288 floats: an item at a time
    finally:
        monkeypatch.undo()
        mf.set_backend("numpy")
