# One model spec, inside MicroPython (or CPython): checkpoint.save writes meta['spec'],
# load_model rebuilds the model, checkpoint.load refuses a model whose spec differs, checkpoints
# older than specs still load.   micropython tests/mp/one_spec_mp.py FOLDER   (prints one JSON line)
import json
import sys

import microformer as mf
from microformer import checkpoint
from microformer.models import IRIS_SPEC, iris_model
from microformer.spec import from_spec, to_spec


def weights(m):
    return [bytes(p.data) for _, p in m.named_params()]


def err(f):
    try:
        f()
    except (ValueError, checkpoint.CheckpointError) as e:
        return str(e)
    return None


class Twice(mf.ActivationLayer):        # a layer of one's own: a spec cannot describe it
    pass


def variant(i, **kw):
    # the Iris spec with layer i's arguments changed (same layer classes, same tag)
    spec = json.loads(json.dumps(IRIS_SPEC))
    spec["layers"][i].update(kw)
    return spec


folder = sys.argv[1]
out = {}
model = iris_model(5)
path = folder + "/iris.mfck"
checkpoint.save(path, model, {"note": "x"})
meta = checkpoint.read_header(path)["meta"]
out["saved_spec"] = meta.get("spec")
back = mf.load_model(path)
out["reload_same"] = weights(back) == weights(model) and to_spec(back) == to_spec(model)
# wider first layer, and a causal attention: the first changes shapes, the second nothing but
# an argument (same tag, same shapes)
wide = from_spec(variant(0, out_features=64))
wide.layers[2] = mf.Reshape((4, 16))
wide.layers[3] = mf.Attention(16, 2)
wide.layers[5] = mf.Dense(16, 3)
out["wide_into_iris"] = err(lambda: checkpoint.load(path, wide))
causal = from_spec(variant(3, causal=True))
before = weights(causal)
out["causal_into_iris"] = err(lambda: checkpoint.load(path, causal))
out["causal_untouched"] = weights(causal) == before
checkpoint.save(folder + "/wide.mfck", wide)
out["iris_into_wide"] = err(lambda: checkpoint.load(folder + "/wide.mfck", iris_model(1)))
# a model a spec cannot describe: saved without a spec (spec='auto'), refused with spec=True
own = mf.Sequential([mf.Dense(4, 3), Twice("relu")])
checkpoint.save(folder + "/own.mfck", own)
out["own_has_spec"] = "spec" in checkpoint.read_header(folder + "/own.mfck")["meta"]
out["own_load_model"] = err(lambda: mf.load_model(folder + "/own.mfck"))
own2 = mf.Sequential([mf.Dense(4, 3), Twice("relu")])
checkpoint.load(folder + "/own.mfck", own2)
out["own_load_checkpoint"] = weights(own2) == weights(own)
out["own_strict"] = err(lambda: checkpoint.save(folder + "/own2.mfck", own, spec=True))
out["wrong_meta_spec"] = err(lambda: checkpoint.save(folder + "/w.mfck", model,
                                                     {"spec": variant(0, out_features=64)}))
# checkpoints written before specs: meta['layers'], or only arch 'iris-attention-v1'
layers = [["Dense", 4, 32], ["ActivationLayer", "relu"], ["Reshape", [4, 8]],
          ["Attention", 8, 2], ["GlobalAvgPool"], ["Dense", 8, 3]]
checkpoint.save(folder + "/old_layers.mfck", model, {"layers": layers}, spec=False)
checkpoint.save(folder + "/old_arch.mfck", model, {"arch": "iris-attention-v1"}, spec=False)
checkpoint.save(folder + "/old_none.mfck", model, {"arch": "something"}, spec=False)
for name in ("old_layers", "old_arch"):
    m = mf.load_model(folder + "/" + name + ".mfck")
    out[name] = weights(m) == weights(model) and to_spec(m) == to_spec(model)
out["old_layers_spec"] = "spec" in checkpoint.read_header(folder + "/old_layers.mfck")["meta"]
out["old_none"] = err(lambda: mf.load_model(folder + "/old_none.mfck"))
print(json.dumps(out))
