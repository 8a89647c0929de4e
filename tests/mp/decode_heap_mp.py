# tests/mp/decode_heap_mp.py: the bench's decode stack (board/benchmarks/bench.py decode_setup) decoding
# greedily in the heap it is given: ROUNDS rounds of prefill + NEW tokens (as bench.decode runs
# them: the second prompt reuses the first one's buffers). Prints the tokens and the heap in use
# (gc.mem_alloc after a collection) after the model, the first prefill and the last round.
#   micropython -X heapsize=512K tests/mp/decode_heap_mp.py [NEW [ROUNDS [BACKEND]]]
import gc
import sys

import bench

import microformer as mf

NEW = int(sys.argv[1]) if len(sys.argv) > 1 else bench.DECODE_NEW
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
model, prompt, x, argmax = bench.decode_setup(sys.argv[3] if len(sys.argv) > 3 else "viper")
P, V = bench.DECODE_PROMPT, bench.DECODE_V
gc.collect()
print("HEAP model", gc.mem_alloc())
for r in range(ROUNDS):
    logits = mf.prefill(model, prompt)
    nxt = argmax(logits.data, (P - 1) * V, V)
    if r == 0:
        gc.collect()
        print("HEAP prefill", gc.mem_alloc())
    tokens = [nxt]
    for _ in range(NEW):
        x.data[0] = nxt
        logits = mf.decode_step(model, x)
        nxt = argmax(logits.data, 0, V)
        tokens.append(nxt)
    print("TOKENS", " ".join(str(t) for t in tokens))
gc.collect()
print("HEAP decode", gc.mem_alloc())
