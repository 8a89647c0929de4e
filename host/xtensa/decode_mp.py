# A decode on viper: an untrained character model of board/demos/charlm.py (embedding, decoder block,
# head; vocabulary 11, E=16), seeded, prefilled with 5 tokens, then 12 greedy decode steps. Prints
# the tokens and the last logits' bits; `make xtensa-test` compares them with the 32-bit unix port.
from binascii import hexlify

import microformer as mf
import charlm

mf.set_backend("viper")
V = 11
model = charlm.build_model(V, seed=7, embed_dim=16, num_heads=2, max_len=24)
model.eval()
ids = [1, 4, 9, 2, 7]
logits = mf.prefill(model, mf.Tensor.from_list([ids]), 24)
nxt = charlm.argmax(logits.data, (len(ids) - 1) * V, V)
out = [nxt]
x = mf.Tensor((1, 1))
for _ in range(12):
    x.data[0] = nxt
    logits = mf.decode_step(model, x)
    nxt = charlm.argmax(logits.data, 0, V)
    out.append(nxt)
print("DECODE tokens", out)
print("DECODE logits", hexlify(bytes(logits.data)).decode())
