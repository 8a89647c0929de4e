# Runs layer cases through lib/microformer and reports every output and gradient.
# The same file runs under CPython (imported by the tests) and under MicroPython:
#   MICROPYPATH=lib micropython tests/mf_driver.py cases.json results.json
import json
from array import array

import microformer as mf


def _tensor(spec):
    return mf.Tensor(tuple(spec["shape"]), array("f", spec["data"]))


def build_layer(spec):
    cls = getattr(mf, spec["type"])
    return cls(*spec.get("args", []), **spec.get("kwargs", {}))


def run_case(case):
    if "backend" in case:
        mf.set_backend(case["backend"])
    layer = build_layer(case["layer"])
    named = {}
    for p, g in layer.params():
        named[p.name] = (p, g)
    for name in case.get("params", {}):
        vals = case["params"][name]
        p = named[name][0]
        for i in range(len(vals)):
            p.data[i] = vals[i]
    kwargs = {}
    if "mask" in case:
        kwargs["key_padding_mask"] = case["mask"]
    if "context" in case:
        kwargs["context"] = _tensor(case["context"])
    x = _tensor(case["x"])
    out = {}
    for rep in range(case.get("repeat", 1)):   # repeat > 1: parameter grads must accumulate
        y = layer.forward(x, **kwargs)
        dx = layer.backward(_tensor(case["dy"]))
    if isinstance(dx, tuple):
        dx, dctx = dx
        out["dcontext"] = list(dctx.data)
    out["y"] = list(y.data)
    out["dx"] = list(dx.data)
    for name in named:
        out["d" + name] = list(named[name][1].data)
    return out


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    results = [run_case(c) for c in cases]
    with open(argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    import sys
    main(sys.argv)
