# A session's fit gives its step's buffers back when it ends: runs under CPython and inside
# MicroPython, directly
#   MICROPYPATH=lib:board:tests/mp micropython tests/mp/session_release_mp.py FLASH
# prints one line per check and raises AssertionError on the first failure.
import sys

import finetune
from microformer import layer as L


def _held(model):
    # the layers (and their parts) that hold buffers of a pass (layer.Buffered stages)
    out = []
    seen = {}

    def walk(x, name):
        if id(x) in seen:
            return
        seen[id(x)] = 1
        if getattr(x, "_stages", None):
            out.append(name)
        for i, y in enumerate(getattr(x, "layers", None) or ()):
            walk(y, "%s%d." % (name, i))
        sub = getattr(x, "sublayers", None)
        if sub is not None:
            for i, y in enumerate(sub()):
                walk(y, "%s%d." % (name, i))
    walk(model, "")
    return out


s = finetune.Session(root=sys.argv[1], verbose=False)
for k in range(2):
    s.fit(epochs=1, data="train", verbose=False)
    held = _held(s.model)
    assert not held, "after fit %d the layers %s still hold the step's buffers" % (k + 1, held)
    assert L.scratch.nbytes() == 0, "after fit %d the scratch arena holds %d bytes" % (k + 1, L.scratch.nbytes())
    print("fit %d: no step buffers held after it" % (k + 1))
r = s.evaluate(verbose=False)
assert r["n"] > 0
print("SESSION RELEASE OK")
