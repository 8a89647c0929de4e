# Checkpoints inside MicroPython (and CPython): the model the tests build, a NumPy-written file
# loaded and saved again, the pure-Python CRC fallback, damage refused with the model untouched,
# saves that die part way leaving the old checkpoint. Run directly:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_mp.py DIR
# DIR holds np.mfck (tests/oracles/checkpoint_np.py's file); prints what it did (test_checkpoint.py compares
# the files it writes with the host's bytes) and raises AssertionError on a failure.
import sys

import microformer as mf
from microformer import checkpoint as ck


def build(seed, E=4, hidden=16):
    """Dense -> ReLU -> [B,S,E] -> Attention -> pool -> Dense (test_checkpoint.py builds it too)."""
    mf.seed(seed)
    return mf.Sequential([mf.Dense(4, hidden), mf.ActivationLayer("relu"), mf.Reshape((hidden // E, E)),
                          mf.Attention(E, 2), mf.GlobalAvgPool(), mf.Dense(E, 3)])


def snap(m):
    return [bytes(p.data) for n, p in m.named_params()]


class Dying:
    """A file that takes n bytes, then fails as a full or unplugged flash would (OSError 28)."""

    def __init__(self, f, n):
        self.f = f
        self.n = n

    def write(self, b):
        k = len(b) if isinstance(b, (bytes, bytearray)) else 4 * len(b)
        if k > self.n:
            self.f.write(bytes(b)[:self.n] if isinstance(b, (bytes, bytearray)) else bytes(memoryview(b))[:self.n])
            self.f.close()
            raise OSError(28)
        self.n -= k
        return self.f.write(b)

    def flush(self):
        self.f.flush()

    def close(self):
        self.f.close()

    def fileno(self):
        raise AttributeError


def main(d):
    # 1. numpy-written file -> MicroPython model -> MicroPython save (host compares the bytes)
    m = build(9)
    meta = ck.load(d + "/np.mfck", m)
    print("meta", meta["from"])
    ck.save(d + "/mp_copy.mfck", m, {"by": "micropython"})
    # 2. a seeded model saved by MicroPython (host compares with the CPython model of the same seed)
    ck.save(d + "/mp_seed3.mfck", build(3), {"epoch": 7})
    # 3. the pure-Python CRC fallback reads and writes the same files
    native = ck._crc32_native
    ck._crc32_native = None
    m2 = build(11)
    ck.load(d + "/mp_copy.mfck", m2)
    assert snap(m2) == snap(m)
    ck.save(d + "/mp_fallback.mfck", m2, {"by": "micropython"})
    ck._crc32_native = native
    print("fallback ok")
    # 4. damage is refused and the model is untouched
    data = open(d + "/mp_copy.mfck", "rb").read()
    before = snap(m2)
    refused = tried = 0
    for off in range(0, len(data), 7):
        for bad in (data[:off], data[:off] + bytes([data[off] ^ (1 << (off % 8))]) + data[off + 1:]):
            with open(d + "/bad.mfck", "wb") as f:
                f.write(bad)
            tried += 1
            try:
                ck.load(d + "/bad.mfck", m2)
            except ValueError:
                refused += 1
            assert snap(m2) == before, "a refused load changed the model (offset %d)" % off
    assert refused == tried, "%d of %d damaged files were loaded" % (tried - refused, tried)
    print("refused", refused)
    # 5. a save that dies after n bytes leaves the old checkpoint
    old = build(3)
    new = build(4)
    size = ck.save(d + "/live.mfck", old)
    crashes = tried = 0
    for n in range(0, size, 5):
        tried += 1
        ck._open = lambda p, mode, n=n: Dying(open(p, mode), n)
        try:
            ck.save(d + "/live.mfck", new)
        except OSError:
            crashes += 1
        ck._open = open
        m3 = build(12)
        ck.load(d + "/live.mfck", m3)
        assert snap(m3) == snap(old), n
    assert crashes == tried, "%d of %d saves cut short did not fail" % (tried - crashes, tried)
    print("crashes", crashes)


if __name__ == "__main__":
    main(sys.argv[1])
