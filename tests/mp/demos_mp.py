# The sequence demos (board/demos/digits.py, board/demos/charlm.py) checked inside MicroPython and CPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython -X heapsize=8M tests/mp/demos_mp.py [backend]
# digits: rows as tokens through an EncoderBlock; charlm: a causal character model generating
# through the KV cache. Prints DEMOS OK and the figures, raises AssertionError on a failure.
import sys

import microformer as mf

import charlm
import digits


def argmax_row(d, off, n):
    best = off
    for i in range(off + 1, off + n):
        if d[i] > d[best]:
            best = i
    return best - off


def greedy_recompute(model, chars, prompt, length):
    """Greedy continuation of `prompt` to `length` characters by full forwards over the whole
    prefix each time (no KV cache): what generate() must produce through the cache."""
    V = len(chars)
    ids = [chars.index(c) for c in prompt]
    model.eval()
    while len(ids) < length:
        logits = model.forward(mf.Tensor.from_list([ids]))
        ids.append(argmax_row(logits.data, (len(ids) - 1) * V, V))
    model.train()
    return "".join(chars[i] for i in ids)


def accuracy_recount(model, data, chunk=32):
    """Held-out accuracy counted here from the model's logits (not by train.evaluate), `chunk`
    images at a time in file order (the viper kernels' block scaling depends on the batch)."""
    model.eval()
    right = 0
    F = data.X.shape[1]
    N = len(data)
    for s in range(0, N, chunk):
        n = min(chunk, N - s)
        logits = model.forward(mf.Tensor((n, F), data.X.data[s * F:(s + n) * F]))
        C = logits.shape[1]
        for b in range(n):
            right += 1 if argmax_row(logits.data, b * C, C) == data.y[s + b] else 0
    model.train()
    return right / N


def kv_cache_per_token(model, max_len):
    """Bytes the KV caches hold per token of capacity, after a one-sequence prefill."""
    mf.prefill(model, mf.Tensor.from_list([[0]]), max_len)
    n = 0
    for l in model.layers:
        a = getattr(l, "attn", None)
        if a is not None:
            n += a.kv_cache_bytes()
    return n / max_len


def check_charlm(c, prompt="the dog "):
    model, chars = c["model"], c["chars"]
    max_len = model.layers[1].max_len                  # the PositionalEncoding's table
    assert len(c["sample"]) == max_len, c["sample"]
    want = greedy_recompute(model, chars, prompt, len(c["sample"]))
    assert c["sample"] == want, "KV-cache generation %r, recomputed %r" % (c["sample"], want)
    assert c["kv_bytes_per_token"] == kv_cache_per_token(model, max_len), c["kv_bytes_per_token"]


def check_digits(d, n_train, n_test):
    assert (d["n_train"], d["n_test"]) == (n_train, n_test), d
    _, test = digits.load_split(None, n_train, n_test)
    acc = accuracy_recount(d["model"], test)
    assert d["test_acc"] == acc, (d["test_acc"], acc)
    assert sum(sum(row) for row in d["confusion"]) == n_test, d["confusion"]
    assert sum(d["confusion"][i][i] for i in range(10)) == round(acc * n_test), d["confusion"]


def main(backend="viper"):
    d = digits.main(epochs=6, backend=backend, verbose=False)
    check_digits(d, 500, 300)
    assert d["test_acc"] >= 0.75, d["test_acc"]         # 10 classes: chance is 0.10
    c = charlm.main(steps=150, backend=backend, verbose=False)
    check_charlm(c)
    assert c["test_acc"] >= 0.5, c["test_acc"]          # next character; chance ~ 1/20
    assert c["tokens_per_s"] > c["tokens_per_s_recompute"] > 0, c
    print("DEMOS OK digits %.4f charlm %.4f %r" % (d["test_acc"], c["test_acc"], c["sample"]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "viper")
