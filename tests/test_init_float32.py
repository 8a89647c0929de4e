"""Seeded Xavier init gives the same float32 bits on CPython, the stock 64-bit MicroPython port and
the 32-bit single-precision port, and those bits are the ones the math asks for (checked here with
NumPy float32 arithmetic and exact fractions, not with lib's code)."""
import json
import os
import subprocess
import sys
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

SCRIPT = r'''
import json
from binascii import hexlify
import microformer as mf
from microformer.tensor import Tensor, Rng, xavier_uniform, xavier_bound
from array import array
out = []
for i, (fi, fo) in enumerate(FANS):
    t = xavier_uniform(Tensor((N,)), fi, fo, Rng(1000 + i))
    out.append([hexlify(bytes(array("f", [xavier_bound(fi, fo)]))).decode(), hexlify(bytes(t.data)).decode()])
mf.seed(3)
m = mf.Sequential([mf.Dense(4, 32), mf.ActivationLayer("relu"), mf.Reshape((4, 8)), mf.Attention(8, 2),
                   mf.GlobalAvgPool(), mf.Dense(8, 3)])
out.append(["iris", hexlify(b"".join(bytes(p.data) for n, p in m.named_params())).decode()])
print(json.dumps(out))
'''.replace("FANS", repr(FANS)).replace("N,", "%d," % N)


def _run_cpython(tmp_path):
    f = tmp_path / "init_cp.py"
    f.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(f)], env=dict(os.environ, PYTHONPATH=helpers.LIB),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


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


def test_cpython_init_is_the_math(tmp_path):
    _check_against_math(_run_cpython(tmp_path))


def test_micropython_init_bit_identical_to_cpython(tmp_path, micropython):
    f = tmp_path / "init_mp.py"
    f.write_text(SCRIPT)
    mp = json.loads(helpers.run_micropython(str(f), exe=micropython))
    cp = _run_cpython(tmp_path)
    assert len(mp) == len(cp) == len(FANS) + 1
    _check_against_math(mp)
    for i, (m, c) in enumerate(zip(mp, cp)):
        what = "the seeded Iris model" if i == len(FANS) else "fans %r" % (FANS[i],)
        assert m == c, "%s: %s differs from CPython bit for bit" % (what, helpers.traits(micropython))


def test_bad_fans_are_refused():
    t = mf.Tensor((4,))
    for fi, fo, word in ((0, 3, "fan_in must be an int >= 1, got 0"), (3, -1, "fan_out must be an int >= 1, got -1"),
                         (2.0, 3, "fan_in must be an int >= 1, got 2.0")):
        with pytest.raises(ValueError, match=word):
            mf.xavier_uniform(t, fi, fo, mf.Rng(1))
