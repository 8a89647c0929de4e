# Float division and formatting on the emulated Xtensa core (tests/mp/test_xtensa_port.py): the
# divisions of argv[1]'s float32 pairs (hex, 8 bytes a pair) go through the port's __divsf3; their
# bits are printed as hex for the host to compare with NumPy's float32 division.
import sys
from array import array
from binascii import hexlify, unhexlify

with open(sys.argv[1]) as f:
    pairs = array('f', unhexlify(f.read().strip()))
n = len(pairs) // 2
out = array('f', range(n))
for i in range(n):
    out[i] = pairs[2 * i] / pairs[2 * i + 1]
print("DIV", hexlify(bytes(out)).decode())
print("REPR", " ".join(repr(pairs[i]) for i in range(0, 40)))
