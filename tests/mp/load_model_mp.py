# load_model_mp.py CHECKPOINT INPUT.json BACKEND: mf.load_model, then one forward; prints the output.
import json
import sys

import microformer as mf

mf.set_backend(sys.argv[3])
model = mf.load_model(sys.argv[1])
with open(sys.argv[2]) as f:
    x = json.load(f)
y = model(mf.Tensor.from_list(x))
print(json.dumps({"shape": list(y.shape), "y": list(y.data)}))
