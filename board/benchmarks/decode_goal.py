# decode_goal.py: the decode goal of make bench-budget as a program that only decodes runs it:
# a causal E=32 character model (Embedding, positions, one EncoderBlock with CACHE tokens of KV
# cache, LayerNorm, Dense; random weights: memory does not depend on their values; eval mode, not
# frozen) prefilling PROMPT tokens and decoding greedily to the end of its cache, with nothing
# imported but microformer (budget.py's training imports are not the decode stack's).
#   micropython decode_goal.py      prints: BUDGET goal batch=1 micro=1 plan_peak=-1 plan_whole=-1 steps=N
# host/bench/bench_budget.py goals finds the smallest -X heapsize it runs in.
import microformer as mf
from microformer import backend
from microformer.tensor import Tensor

CACHE = 318
PROMPT = 16


def model():
    """The goal's model (eval mode, not frozen) and its vocabulary size."""
    mf.seed(4)
    E, V = 32, 32
    m = mf.Sequential([mf.Embedding(V, E), mf.PositionalEncoding(CACHE, E),
                       mf.EncoderBlock(E, 2, 2 * E, causal=True, max_len=CACHE),
                       mf.LayerNorm(E), mf.Dense(E, V)])
    m.eval()
    return m, V


def prompt(V):
    p = Tensor((1, PROMPT))
    for i in range(PROMPT):
        p.data[i] = (3 * i + 1) % V
    return p


def run():
    import gc
    m, V = model()
    x = Tensor((1, 1))
    p = prompt(V)
    gc.collect()
    logits = mf.prefill(m, p, CACHE)
    nxt = backend.K.argmax(logits.data, (PROMPT - 1) * V, V)
    n = 0
    for _ in range(CACHE - PROMPT):
        x.data[0] = nxt
        logits = mf.decode_step(m, x)
        nxt = backend.K.argmax(logits.data, 0, V)
        n += 1
    print("BUDGET goal batch=1 micro=1 plan_peak=-1 plan_whole=-1 steps=%d" % n)


if __name__ == "__main__":
    run()
