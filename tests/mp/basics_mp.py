# Under MicroPython and CPython alike: PRNG sequence, views, and error messages, printed as JSON.
# Floats are printed as the hex of their float32 bits: a single-precision port's repr has fewer
# digits than a double's, so decimal strings differ where the float32 values are the same.
import json
from array import array
from binascii import hexlify

import microformer as mf

out = {}
r = mf.Rng(42)
out["u32"] = [r.next_u32() for _ in range(5)]
out["uniform"] = hexlify(bytes(array("f", [r.uniform(-1.0, 1.0) for _ in range(3)]))).decode()
out["shuffle"] = mf.Rng(7).shuffle(list(range(10)))
mf.seed(11)
out["dense_W"] = hexlify(bytes(mf.Dense(3, 2).W.data)).decode()
t = mf.Tensor.from_list([[1, 2, 3], [4, 5, 6]])
v = t.reshape(3, 2)
v.data[0] = 9.0
out["view"] = [t.tolist(), v.tolist()]
errors = []
for make in (lambda: mf.Attention(8, 2).forward(mf.Tensor((16, 4, 6))),
             lambda: mf.Attention(8, 3),
             lambda: mf.Dense(4, 3).backward(mf.Tensor((2, 3))),
             lambda: mf.CrossEntropyLoss().forward(mf.Tensor((2, 3)), [0, 5])):
    try:
        make()
        errors.append("no error")
    except (ValueError, RuntimeError) as e:
        errors.append("%s: %s" % (type(e).__name__, e))
out["errors"] = errors
print(json.dumps(out))
