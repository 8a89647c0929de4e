"""What the kernel-case drivers (range_cases_mp.py, decode_cases_mp.py) share: the argument
convention, the kernel modules and the float32 hex conversions.

    micropython DRIVER CASES.json RESULTS.json [CHECKED_DIR]

CASES.json: a list of cases, each with a "kind"; RESULTS.json gets one result per case (a dict, or
{"error": repr(exception)}) and the driver prints "DONE n". CHECKED_DIR: a folder holding
kv_checked.py, the viper kernels with every `#!chk` bound asserted (tests/mp/test_viper.py makes it);
it then stands in for kernels_viper.
"""
import sys
import json
from array import array
from binascii import hexlify, unhexlify

if len(sys.argv) > 3:
    sys.path.insert(0, sys.argv[3])
    import kv_checked as V            # the copy that checks every #!chk bound
else:
    from microformer import kernels_viper as V  # noqa: F401
from microformer import kernels as P  # noqa: F401


def f32(h):
    return array('f', unhexlify(h))


def hx(a):
    return hexlify(bytes(a)).decode()


def z(n):
    return array('f', bytes(4 * n))


def main(run):
    """run: a function of a case, or a dict kind -> function."""
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for c in cases:
        try:
            out.append(run[c["kind"]](c) if isinstance(run, dict) else run(c))
        except Exception as e:
            out.append({"error": repr(e)})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    print("DONE", len(out))
