"""Seeded Xavier init gives the same float32 bits on CPython, the stock 64-bit MicroPython port and
the 32-bit single-precision port, and those bits are the ones the math asks for (checked here with
NumPy float32 arithmetic and exact fractions, not with lib's code)."""
import json
from fractions import Fraction

import numpy as np
import pytest

import helpers
import microformer as mf

# (fan_in, fan_out) pairs: the smallest sum, the demos' layers, and sums up to 2^31 (a bound of
# ~5e-5: many normalization steps, big ints on a 32-bit port)
FANS = [(1, 1), (1, 2), (3, 2), (4, 32), (8, 8), (32, 3), (27, 16), (300, 200), (4096, 4096),
        (10 ** 6, 1), (2 ** 30, 2 ** 30)]
N = 64          # weights drawn per pair

SCRIPT = helpers.script("init_float32_mp.py")
ARGS = (json.dumps(FANS), N)


def _run_cpython():
    return json.loads(helpers.run_cpython(SCRIPT, *ARGS))


def _expected(fi, fo, seed):
    """The bound and weights from the math: a = sqrt(6/n) rounded down to a float32 with 24
    significant bits, u = (k - 2^23) / 2^23 from xorshift32's top 24 bits, w = fl32(a * u)."""
    n = fi + fo
    exact = Fraction(6, n)                             # a^2 must not exceed this
    a = np.float32(np.sqrt(6.0 / n))
    while Fraction(float(a)) ** 2 > exact:
        a = np.nextafter(a, np.float32(0))
    while Fraction(float(np.nextafter(a, np.float32(2)))) ** 2 <= exact:
        a = np.nextafter(a, np.float32(2))
    x, w = seed & 0xFFFFFFFF, []
    for _ in range(N):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        u = np.float32(((x >> 8) - 2 ** 23) / 2 ** 23)  # exact: 24-bit integer over a power of 2
        w.append(np.float32(a * u))                    # one float32 product, correctly rounded
    return a, np.array(w, dtype=np.float32)


def _check_against_math(rows):
    for i, (fi, fo) in enumerate(FANS):
        a, w = _expected(fi, fo, 1000 + i)
        got_a = np.frombuffer(bytes.fromhex(rows[i][0]), dtype=np.float32)[0]
        got_w = np.frombuffer(bytes.fromhex(rows[i][1]), dtype=np.float32)
        assert got_a == a, "fans %r: bound %r, want %r (the largest float32 with a^2 <= 6/n)" % (
            (fi, fo), float(got_a), float(a))
        assert got_w.tobytes() == w.tobytes(), "fans %r: weights differ from fl32(a * u) in %d of %d" % (
            (fi, fo), int((got_w != w).sum()), N)
        assert np.abs(got_w).max() <= a and np.abs(got_w).max() > 0.8 * a


def test_cpython_init_is_the_math():
    _check_against_math(_run_cpython())


def test_micropython_init_bit_identical_to_cpython(micropython):
    mp = json.loads(helpers.run_micropython(SCRIPT, *ARGS, exe=micropython))
    cp = _run_cpython()
    assert len(mp) == len(cp) == len(FANS) + 1
    _check_against_math(mp)
    for i, (m, c) in enumerate(zip(mp, cp, strict=True)):
        what = "the seeded Iris model" if i == len(FANS) else "fans %r" % (FANS[i],)
        assert m == c, "%s: %s differs from CPython bit for bit" % (what, helpers.traits(micropython))


def test_bad_fans_are_refused():
    t = mf.Tensor((4,))
    for fi, fo, word in ((0, 3, "fan_in must be an int >= 1, got 0"), (3, -1, "fan_out must be an int >= 1, got -1"),
                         (2.0, 3, "fan_in must be an int >= 1, got 2.0")):
        with pytest.raises(ValueError, match=word):
            mf.xavier_uniform(t, fi, fo, mf.Rng(1))
