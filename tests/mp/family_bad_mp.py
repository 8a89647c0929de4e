# Bad input to the attention family: each entry must raise a clear error naming the layer and the
# expected value. Runs under CPython (tests/mp/test_family.py) and inside MicroPython (same file).
import microformer as mf


def _x(B, S, E):
    return mf.Tensor((B, S, E))


def _causal(E=8, max_len=4):
    a = mf.Attention(E, 2, causal=True, max_len=max_len)
    a.prefill(_x(1, 2, E))
    return a


def _full_cache():
    a = _causal(max_len=3)
    a.decode_step(_x(1, 1, 8))
    a.decode_step(_x(1, 1, 8))


CASES = [
    ("mask wrong batch", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), key_padding_mask=[[0, 1, 0, 0]])),
    ("mask row length", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), key_padding_mask=[[0, 1, 0], [0, 0, 0, 0]])),
    ("mask wrong type", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), key_padding_mask=7)),
    ("mask bytes length", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), key_padding_mask=bytes(5))),
    ("lengths too long", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), lengths=[5, 2])),
    ("lengths wrong count", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), lengths=[3])),
    ("mask and lengths", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), key_padding_mask=[[0] * 4] * 2, lengths=[4, 4])),
    ("context embed size", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), context=_x(2, 5, 6))),
    ("context batch", lambda: mf.Attention(8, 2).forward(_x(2, 4, 8), context=_x(3, 5, 8))),
    ("decode past capacity", _full_cache),
    ("decode non-causal", lambda: mf.Attention(8, 2).decode_step(_x(1, 1, 8))),
    ("prefill non-causal", lambda: mf.Attention(8, 2, max_len=4).prefill(_x(1, 2, 8))),
    ("block decode non-causal", lambda: mf.EncoderBlock(8, 2, 16).decode_step(_x(1, 1, 8))),
    ("decode before prefill", lambda: mf.Attention(8, 2, causal=True, max_len=4).decode_step(_x(1, 1, 8))),
    ("prefill without capacity", lambda: mf.Attention(8, 2, causal=True).prefill(_x(1, 2, 8))),
    ("prompt longer than cache", lambda: mf.Attention(8, 2, causal=True, max_len=2).prefill(_x(1, 3, 8))),
    ("decode token shape", lambda: _causal().decode_step(_x(1, 2, 8))),
    ("token id out of range", lambda: mf.Embedding(10, 4).forward([[1, 10]])),
    ("token id negative", lambda: mf.Embedding(10, 4).forward([[-1, 2]])),
    ("token id not an int", lambda: mf.Embedding(10, 4).forward([[1.5, 2]])),
    ("ids wrong type", lambda: mf.Embedding(10, 4).forward(b"\x01\x02")),
    ("layernorm width", lambda: mf.LayerNorm(8).forward(_x(2, 3, 6))),
    ("feedforward width", lambda: mf.FeedForward(8, 16).forward(_x(2, 3, 6))),
    ("posenc too long", lambda: mf.PositionalEncoding(4, 8).forward(_x(1, 5, 8))),
    ("posenc width", lambda: mf.PositionalEncoding(4, 8).forward(_x(1, 3, 6))),
    ("block width", lambda: mf.EncoderBlock(8, 2, 16).forward(_x(1, 3, 6))),
    ("block heads", lambda: mf.EncoderBlock(8, 3, 16)),
    ("layernorm backward first", lambda: mf.LayerNorm(8).backward(_x(1, 1, 8))),
]


def run_all():
    out = {}
    for name, fn in CASES:
        try:
            fn()
            out[name] = "NO ERROR"
        except (ValueError, RuntimeError) as e:
            out[name] = "%s: %s" % (type(e).__name__, e)
    return out
