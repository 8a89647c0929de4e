"""Attention.reserve_cache (what mf.prefill makes before the kept weight copies): a prompt's cache
made ahead is the one prefill fills (same outputs as a prefill without it), sizes prefill would
refuse make nothing, and decode_step is refused between a reserve and a completed prefill (a
zeroed cache is never decoded from as if it held the prompt)."""
import pytest

import microformer as mf
from microformer.tensor import Rng, Tensor


def _x(S, E=8, seed=3):
    x = Tensor((1, S, E))
    r = Rng(seed)
    for i in range(S * E):
        x.data[i] = r.signed_unit()
    return x


def _attn():
    mf.seed(2)
    return mf.Attention(8, 2, causal=True, max_len=6)


def test_a_reserved_cache_decodes_as_a_plain_prefill():
    a, b = _attn(), _attn()
    b.reserve_cache(1, 4)
    ya, yb = a.prefill(_x(4)), b.prefill(_x(4))
    assert list(ya.data) == list(yb.data)
    assert list(a.decode_step(_x(1, seed=5)).data) == list(b.decode_step(_x(1, seed=5)).data)


def test_decode_step_is_refused_after_a_reserve_until_prefill_completes():
    a = _attn()
    a.prefill(_x(4))
    a.decode_step(_x(1, seed=5))
    a.reserve_cache(1, 4)
    with pytest.raises(RuntimeError, match="before prefill"):
        a.decode_step(_x(1, seed=5))
    a.prefill(_x(4))
    a.decode_step(_x(1, seed=5))


def test_sizes_prefill_refuses_make_nothing():
    a = _attn()
    a.prefill(_x(4))
    y = list(a.decode_step(_x(1, seed=5)).data)
    b = _attn()
    b.prefill(_x(4))
    b.reserve_cache(1, 7)                 # a prompt longer than the cache: prefill would refuse it
    assert list(b.decode_step(_x(1, seed=5)).data) == y
