# fx_models_mp.py JOBS.json OUT.json BACKEND: for each job {case, ck, x[, dy]}, mf.load_model(ck) in
# eval mode and one forward of x; with dy, the backward too: the input gradient and every
# parameter's gradient by its state_dict name. Writes {case: {shape, y[, dx, grads]}}.
import json
import sys

import microformer as mf

mf.set_backend(sys.argv[3])
with open(sys.argv[1]) as f:
    jobs = json.load(f)
out = {}
for job in jobs:
    model = mf.load_model(job["ck"])
    model.eval()
    y = model(mf.Tensor.from_list(job["x"]))
    r = {"shape": list(y.shape), "y": list(y.data)}
    if "dy" in job:
        dx = model.backward(mf.Tensor.from_list(job["dy"]), True, True)
        r["dx"] = list(dx.data) if dx is not None else None
        grad = {}
        for p, g in model.params():
            grad[id(p)] = g
        r["grads"] = {}
        for name, parts in model.state_parts():
            v = []
            for p in parts:
                v.extend(list(grad[id(p)].data))
            r["grads"][name] = v
    out[job["case"]] = r
    print(job["case"], "ok")
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
