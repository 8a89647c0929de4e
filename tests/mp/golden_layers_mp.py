# The DecoderBlock and Conv1D golden vectors (tests/golden/decoder.mfg, conv1d.mfg, written by
# tests/oracles/golden_vectors.py from the NumPy reference) checked by lib inside MicroPython, on both backends:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/golden_layers_mp.py tests/golden
# prints the worst error per backend and layer and GOLDEN LAYERS OK; AssertionError on a failure.
import sys

from microformer import golden

TOL = {"python": 1e-4, "viper": 5e-3}


def main(d):
    for be in ("python", "viper"):
        for name, check in (("decoder", golden.check_decoder), ("conv1d", golden.check_conv1d)):
            e = check(d + "/" + name + ".mfg", be)
            worst = max(e.values())
            print(be, name, len(e), worst)
            assert worst <= TOL[be], (be, name, e)
    print("GOLDEN LAYERS OK")


if __name__ == "__main__":
    main(sys.argv[1])
