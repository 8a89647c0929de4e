# state_dict / load_state_dict inside MicroPython (and CPython): names, order, values, refusal.
import json

import microformer as mf

mf.seed(3)
m = mf.Sequential([mf.Embedding(7, 4), mf.EncoderBlock(4, 2, 6), mf.LayerNorm(4), mf.Dense(4, 7)])
sd = m.state_dict()
out = {"keys": list(sd), "shapes": [list(v.shape) for v in sd.values()]}
lists = {k: v.tolist() for k, v in sd.items()}
mf.seed(4)
m2 = mf.Sequential([mf.Embedding(7, 4), mf.EncoderBlock(4, 2, 6), mf.LayerNorm(4), mf.Dense(4, 7)])
before = [bytes(p.data) for p, _ in m2.params()]
bad = dict(lists)
bad["3.bias"] = [0.0] * 6
try:
    m2.load_state_dict(bad)
    out["bad"] = "no error"
except ValueError as e:
    out["bad"] = str(e)
out["untouched"] = before == [bytes(p.data) for p, _ in m2.params()]
m2.load_state_dict(lists)
out["equal"] = [bytes(p.data) for p, _ in m2.params()] == [bytes(p.data) for p, _ in m.params()]
ids = mf.Tensor.from_list([[1, 2, 3]])
out["same_output"] = list(m(ids).data) == list(m2(ids).data)
print(json.dumps(out))
