# seq2seq.py: reversing digit strings with the encoder-decoder Transformer (board REPL, MicroPython
# or CPython). "31415" -> "51413": the decoder writes the source backwards, one digit per step,
# then an end token.
#   >>> import seq2seq; seq2seq.main("seq2seq.mfck")   # a host-trained checkpoint (host/tools/train_seq2seq.py):
#                                                      # greedy-decode the held-out strings through the
#                                                      # caches; exact match and tokens/s per backend
# Tokens. Source: 0 pad, 1 + d for digit d, END_SRC after the last digit.
#         Target: 0 pad, BOS, EOS, DIGIT0 + d for digit d.
# The held-out strings come from HELDOUT_SEED; training never samples one of them.
import gc
import time

import microformer as mf
from microformer.tensor import Rng
from microformer.train import argmax

MIN_LEN = 3
MAX_LEN = 8
END_SRC = 11
SRC_VOCAB = 12
BOS = 1
EOS = 2
DIGIT0 = 3
TGT_VOCAB = 13
HELDOUT_SEED = 2024
N_HELDOUT = 200


def build_model(seed=1, embed_dim=32, num_heads=4, ffn_hidden=64, layers=2):
    mf.seed(seed)
    return mf.Transformer(SRC_VOCAB, TGT_VOCAB, embed_dim, num_heads, ffn_hidden, layers, layers,
                          max_len=MAX_LEN + 2, activation="relu")


def sample(rng):
    """A random digit string (a list of ints 0..9) of MIN_LEN..MAX_LEN digits."""
    n = MIN_LEN + rng.randint(MAX_LEN - MIN_LEN + 1)
    return [rng.randint(10) for _ in range(n)]


def heldout():
    """The N_HELDOUT held-out strings (distinct), the same on every port."""
    rng = Rng(HELDOUT_SEED)
    out = []
    seen = set()
    while len(out) < N_HELDOUT:
        s = sample(rng)
        if tuple(s) not in seen:
            seen.add(tuple(s))
            out.append(s)
    return out


def target(digits):
    """The answer: the digits reversed."""
    return digits[::-1]


def source_batch(strings):
    """(src ids [B][MAX_LEN+1] padded, lengths): digits then END_SRC."""
    src = []
    lengths = []
    for s in strings:
        row = [1 + d for d in s] + [END_SRC]
        lengths.append(len(row))
        src.append(row + [0] * (MAX_LEN + 1 - len(row)))
    return src, lengths


def training_batch(strings):
    """(src, src_lengths, tgt_in, labels): teacher forcing; tgt_in = BOS + answer, labels = answer
    + EOS, both padded to MAX_LEN + 1 (padding labels are 0: the model learns to pad after EOS)."""
    src, lengths = source_batch(strings)
    tgt = []
    labels = []
    for s in strings:
        ans = [DIGIT0 + d for d in target(s)]
        row = [BOS] + ans
        tgt.append(row + [0] * (MAX_LEN + 1 - len(row)))
        lab = ans + [EOS]
        labels.extend(lab + [0] * (MAX_LEN + 1 - len(lab)))
    return src, lengths, tgt, labels


def decode_tokens(tokens):
    """Generated target ids -> digits (up to EOS); None for a malformed output."""
    out = []
    for t in tokens:
        if t == EOS:
            return out
        if t < DIGIT0:
            return None
        out.append(t - DIGIT0)
    return None                      # no EOS within the budget


def _ms():
    try:
        return time.ticks_ms()
    except AttributeError:
        return int(time.time() * 1000)


def _since(t0):
    try:
        return time.ticks_diff(time.ticks_ms(), t0)
    except AttributeError:
        return _ms() - t0


def evaluate(model, strings, batch_size=20):
    """Greedy decoding through the caches (padded batches): a dict with exact-match accuracy, the
    accuracy of copying the input, tokens/s, and the decoded outputs."""
    exact = 0
    copy = 0
    tokens = 0
    ms = 0
    outputs = []
    for i in range(0, len(strings), batch_size):
        chunk = strings[i:i + batch_size]
        src, lengths = source_batch(chunk)
        gc.collect()
        t0 = _ms()
        gen = model.generate(src, lengths, BOS, MAX_LEN + 1, EOS)
        ms += _since(t0)
        for s, g in zip(chunk, gen):
            tokens += len(g)
            got = decode_tokens(g)
            outputs.append(got)
            if got == target(s):
                exact += 1
            if s == target(s):
                copy += 1
    n = len(strings)
    return {"exact": exact / n, "copy": copy / n, "tokens": tokens, "seconds": ms / 1000.0,
            "tokens_per_s": tokens * 1000.0 / ms if ms > 0 else None, "outputs": outputs, "n": n}


def greedy_recompute(model, src, lengths, max_new):
    """Greedy decoding without the caches: the full forward over the whole prefix for every new
    token (what the caches save); the same outputs as model.generate."""
    B = len(src)
    tgt = [[BOS] for _ in range(B)]
    out = [[] for _ in range(B)]
    done = [0] * B
    V = TGT_VOCAB
    for t in range(max_new):
        logits = model.forward(src, tgt, lengths)
        d = logits.data
        for b in range(B):
            best = argmax(d, (b * (t + 1) + t) * V, V)
            tgt[b].append(best)
            if not done[b]:
                out[b].append(best)
                done[b] = best == EOS
        if all(done):
            break
    return out


def recompute_speed(model, strings, batch_size=20):
    """(tokens/s decoding without the caches, whether every output equals the cached decoding's)."""
    same = True
    tokens = 0
    ms = 0
    for i in range(0, len(strings), batch_size):
        chunk = strings[i:i + batch_size]
        src, lengths = source_batch(chunk)
        gc.collect()
        t0 = _ms()
        slow = greedy_recompute(model, src, lengths, MAX_LEN + 1)
        ms += _since(t0)
        fast = model.generate(src, lengths, BOS, MAX_LEN + 1, EOS)
        for a, b in zip(slow, fast):
            tokens += len(a)
            same = same and a == b
    return (tokens * 1000.0 / ms if ms > 0 else None), same


def _show(digits):
    return "".join(str(d) for d in digits) if digits is not None else "<malformed>"


def main(checkpoint="seq2seq.mfck", backends=None, batch_size=20, n_recompute=20, verbose=True):
    """Load the checkpoint, greedy-decode the held-out strings on each backend (batch_size strings
    at a time: the layers' buffers grow with it), and the first n_recompute of them again without
    the caches for comparison; returns {backend: evaluate(...) dict}."""
    model, meta = mf.load_model(checkpoint, with_meta=True)
    task = meta.get("task")
    if task != {"name": "reverse", "min_len": MIN_LEN, "max_len": MAX_LEN, "heldout_seed": HELDOUT_SEED}:
        raise ValueError("seq2seq: checkpoint %r is for task %r, not this file's" % (checkpoint, task))
    strings = heldout()
    backends = backends or [b for b in ("python", "viper", "numpy") if b in mf.available_backends()]
    results = {}
    for b in backends:
        mf.set_backend(b)
        r = evaluate(model, strings, batch_size)
        gc.collect()
        r["heap_held"] = gc.mem_alloc() if hasattr(gc, "mem_alloc") else None
        if n_recompute:
            r["recompute_tokens_per_s"], r["recompute_same"] = recompute_speed(model, strings[:n_recompute],
                                                                              batch_size)
        results[b] = r
        if verbose:
            print("backend %s: held-out exact match %.1f%% (%d strings; copying the input: %.1f%%), "
                  "%d tokens in %.2f s = %.0f tokens/s, batch %d%s"
                  % (b, 100 * r["exact"], r["n"], 100 * r["copy"], r["tokens"], r["seconds"],
                     r["tokens_per_s"] or 0, batch_size,
                     "" if r["heap_held"] is None else ", heap held %d bytes" % r["heap_held"]))
            if n_recompute:
                print("  without the caches (full forward per token, first %d strings): %.0f tokens/s, "
                      "outputs %s" % (n_recompute, r["recompute_tokens_per_s"] or 0,
                                      "the same" if r["recompute_same"] else "DIFFERENT"))
    if verbose:
        first = results[backends[0]]["outputs"]
        for k in range(3):
            print("  %s -> %s" % (_show(strings[k]), _show(first[k])))
    return results
