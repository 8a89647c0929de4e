# fx_models_mp.py JOBS.json OUT.json BACKEND: for each job {case, ck, x}, mf.load_model(ck) in eval
# mode and one forward of x; writes {case: {shape, y}}.
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
    out[job["case"]] = {"shape": list(y.shape), "y": list(y.data)}
    print(job["case"], "ok")
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
