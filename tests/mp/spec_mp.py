# to_spec / from_spec under MicroPython and CPython: every layer type through JSON and back.
import json

import microformer as mf
from microformer.models import iris_model
from microformer.spec import from_spec, to_spec

MODELS = [
    iris_model(),
    mf.Sequential([mf.Embedding(11, 8), mf.PositionalEncoding(16, 8),
                   mf.EncoderBlock(8, 2, 12, causal=True, activation="gelu_tanh", max_len=16),
                   mf.LayerNorm(8, eps=1e-6), mf.FeedForward(8, 5, "relu", use_bias=False),
                   mf.Dense(8, 11, use_bias=False)]),
    mf.Attention(6, 3, use_bias=False, causal=True, max_len=9),
]
out = []
for m in MODELS:
    s = to_spec(m)
    text = json.dumps(s)
    m2 = from_spec(json.loads(text))
    out.append({"spec": s, "again": to_spec(m2),
                "shapes": [list(p.shape) for p, _ in m.params()],
                "shapes2": [list(p.shape) for p, _ in m2.params()]})
errors = []
for bad in ({"type": "Conv9"}, {"type": "Sequential", "layers": [{"type": "Dense", "in_features": 2}]},
            {"type": "Sequential"}, [1, 2], {"type": "Dense", "in_features": 2, "out_features": 0}):
    try:
        from_spec(bad)
        errors.append("no error")
    except ValueError as e:
        errors.append(str(e))
print(json.dumps({"models": out, "errors": errors}))
