# The golden vectors (tests/golden/attention.mfg, written by tests/oracles/golden_vectors.py from the NumPy
# reference) checked by lib's Attention inside MicroPython, on both backends. Run directly:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/golden_mp.py tests/golden/attention.mfg
# prints the worst error per backend and GOLDEN OK, raises AssertionError on a failure.
import sys

from microformer import golden

TOL = {"python": 1e-4, "viper": 5e-3}


def main(path):
    for be in ("python", "viper"):
        e, p = golden.check_attention(path, be)
        worst = max(e.values())
        print(be, worst, len(p))
        assert not p, p
        assert worst <= TOL[be], (be, e)
    print("GOLDEN OK")


if __name__ == "__main__":
    main(sys.argv[1])
