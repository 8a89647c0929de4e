# Seeded Xavier init as float32 bits, under CPython and inside MicroPython (test_init_float32.py
# checks them against the math and across interpreters). Run directly:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/init_float32_mp.py '[[1, 1], [4, 32]]' 64
# prints a JSON list: per (fan_in, fan_out) pair the hex of the bound and of N weights drawn with
# Rng(1000 + index), then the weights of board/demos/iris.py's model seeded with 3.
import json
import sys
from array import array
from binascii import hexlify

import iris
from microformer.tensor import Rng, Tensor, xavier_bound, xavier_uniform


def main(fans, n):
    out = []
    for i, (fi, fo) in enumerate(fans):
        t = xavier_uniform(Tensor((n,)), fi, fo, Rng(1000 + i))
        out.append([hexlify(bytes(array("f", [xavier_bound(fi, fo)]))).decode(), hexlify(bytes(t.data)).decode()])
    m = iris.build_model(3)
    out.append(["iris", hexlify(b"".join(bytes(p.data) for n_, p in m.named_params())).decode()])
    print(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
