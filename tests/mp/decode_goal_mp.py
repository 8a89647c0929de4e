# tests/mp/decode_goal_mp.py: the decode goal of make bench-budget (board/benchmarks/decode_goal.py:
# a causal E=32 model, not frozen, a 318-token cache) prefilling 16 tokens and
# decoding greedily to the end of its cache. Prints the heap in use (gc.mem_alloc after a
# collection) after the prefill, after the first step and after the last one, and the tokens;
# before them, micropython.mem_info() once the model is built, and whether building it loaded the
# portable kernels (microformer.kernels: PORTABLE 1).
#   micropython -X heapsize=16M tests/mp/decode_goal_mp.py
import gc
import sys

import micropython

import decode_goal

import microformer as mf
from microformer import backend
from microformer.tensor import Tensor

model, V = decode_goal.model()
gc.collect()
micropython.mem_info()                 # "max free sz": the largest free run of blocks the model left
print("PORTABLE", 1 if "microformer.kernels" in sys.modules else 0)
L = decode_goal.CACHE
P = decode_goal.PROMPT
prompt = decode_goal.prompt(V)
x = Tensor((1, 1))
gc.collect()
logits = mf.prefill(model, prompt, L)
nxt = backend.K.argmax(logits.data, (P - 1) * V, V)
gc.collect()
print("HEAP prefill", gc.mem_alloc())
tokens = [nxt] * (L - P + 1)           # made now: a list grown per token would be heap of its own
for t in range(L - P):
    x.data[0] = nxt
    logits = mf.decode_step(model, x)
    nxt = backend.K.argmax(logits.data, 0, V)
    tokens[t + 1] = nxt
    if t == 0:
        gc.collect()
        print("HEAP first", gc.mem_alloc())
gc.collect()
print("HEAP last", gc.mem_alloc())
print("TOKENS", " ".join(str(t) for t in tokens))
