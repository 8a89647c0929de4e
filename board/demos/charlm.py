# charlm.py: a tiny causal character model, trained on the board, generating text through the KV cache.
#   >>> import charlm; charlm.main(steps=300)
# ids -> Embedding(V,E) -> PositionalEncoding -> EncoderBlock(E,2,2E, causal) -> LayerNorm -> Dense(E,V)
# Generation: prefill(prompt) once, then one decode_step per new character (cached K/V, no recompute).
import time

import microformer as mf
from microformer.train import argmax

# A small made-up text (written for this demo, no licence needed): rhymes the model can learn.
TEXT = ("the cat sat on the mat. the dog sat on the log. the fox ran to the box. "
        "the hen ran to the pen. the bee flew to the tree. the cow sat by the plow. ") * 6


def vocab(text=TEXT):
    return sorted(set(text))


def encode(text, chars):
    return [chars.index(c) for c in text]


def build_model(V, seed=1, embed_dim=24, num_heads=2, max_len=32):
    mf.seed(seed)
    E = embed_dim
    return mf.Sequential([
        mf.Embedding(V, E),                                        # ids [B,S] -> [B,S,E]
        mf.PositionalEncoding(max_len, E),
        mf.EncoderBlock(E, num_heads, 2 * E, causal=True, max_len=max_len),
        mf.LayerNorm(E),
        mf.Dense(E, V),                                            # next-character logits
    ])


class Windows:
    """(ids [B,S], next-char labels [B*S]) batches of random windows, reusing one buffer."""

    def __init__(self, ids, S, B, rng):
        self.ids, self.S, self.B, self.rng = ids, S, B, rng
        self.X = mf.Tensor((B, S))
        self.y = [0] * (B * S)

    def batch(self, start=None):
        S, ids = self.S, self.ids
        for b in range(self.B):
            s = start + b * S if start is not None else self.rng.randint(len(ids) - S - 1)
            for t in range(S):
                self.X.data[b * S + t] = ids[s + t]
                self.y[b * S + t] = ids[s + t + 1]
        return self.X, self.y


def _step(model, loss_fn, X, y, B, S, V):
    logits = model.forward(X)                     # [B,S,V]
    loss = loss_fn.forward(logits.reshape(B * S, V), y)
    return logits, loss


def accuracy(model, ids, S=32, B=2):
    """Next-character accuracy over consecutive windows of ids (teacher forcing)."""
    V = model[0].vocab
    loss_fn = mf.CrossEntropyLoss()
    w = Windows(ids, S, B, None)
    right = total = 0
    model.eval()
    for start in range(0, len(ids) - B * S - 1, B * S):
        X, y = w.batch(start)
        logits, _ = _step(model, loss_fn, X, y, B, S, V)
        for i in range(B * S):
            right += argmax(logits.data, i * V, V) == y[i]
            total += 1
    model.train()
    return right / max(1, total)


def generate(model, chars, prompt, n=40, max_len=32):
    """Greedy decoding: prefill the prompt, then n decode steps. Returns (text, tokens per second)."""
    V = len(chars)
    ids = encode(prompt, chars)
    model.eval()
    logits = mf.prefill(model, mf.Tensor.from_list([ids]), max_len)
    nxt = argmax(logits.data, (len(ids) - 1) * V, V)
    out = [chars[nxt]]
    x = mf.Tensor((1, 1))
    n = min(n, max_len - len(ids))
    t0 = time.ticks_ms() if hasattr(time, "ticks_ms") else None
    t1 = time.time()
    for _ in range(n - 1):
        x.data[0] = nxt
        logits = mf.decode_step(model, x)
        nxt = argmax(logits.data, 0, V)
        out.append(chars[nxt])
    if t0 is not None:
        secs = time.ticks_diff(time.ticks_ms(), t0) / 1000.0
    else:
        secs = time.time() - t1
    model.train()
    return prompt + "".join(out), (n - 1) / max(secs, 1e-6)


def _now_ms():
    return time.ticks_ms() if hasattr(time, "ticks_ms") else time.time() * 1000.0


def _since_ms(t0):
    return time.ticks_diff(time.ticks_ms(), t0) if hasattr(time, "ticks_ms") else time.time() * 1000.0 - t0


def decode_speed(model, max_len=32, rounds=4):
    """Tokens per second generating max_len - 1 tokens after a 1-token prompt, (a) through the KV
    cache and (b) recomputing the whole causal forward over the prefix for every new token."""
    model.eval()
    x = mf.Tensor((1, 1))
    n = 0
    t0 = _now_ms()
    for _ in range(rounds):
        mf.prefill(model, x, max_len)
        for t in range(1, max_len):
            x.data[0] = t % model[0].vocab
            mf.decode_step(model, x)
            n += 1
    cached = 1000.0 * n / max(1, _since_ms(t0))
    n = 0
    t0 = _now_ms()
    for t in range(2, max_len + 1):
        model.forward(mf.Tensor((1, t)))      # the same work a cache-less decoder does per token
        n += 1
    recompute = 1000.0 * n / max(1, _since_ms(t0))
    model.train()
    return cached, recompute


def main(steps=300, backend=None, verbose=True, seed=1, S=32, B=4, lr=1e-2, prompt="the dog ", n=24):
    """Train for `steps` batches; returns held-out accuracy, decoding speed, a sample and the model."""
    if backend:
        mf.set_backend(backend)
    chars = vocab()
    V = len(chars)
    ids = encode(TEXT, chars)
    cut = len(ids) * 9 // 10
    train_ids, test_ids = ids[:cut], ids[cut:]
    model = build_model(V, seed)
    opt = mf.Adam(model, lr=lr)
    loss_fn = mf.CrossEntropyLoss()
    w = Windows(train_ids, S, B, mf.Rng(seed + 1))
    history = []
    t0 = time.time()
    run = 0.0
    for step in range(1, steps + 1):
        X, y = w.batch()
        opt.zero_grad()
        logits, loss = _step(model, loss_fn, X, y, B, S, V)
        model.backward(loss_fn.backward().reshape(B, S, V))
        opt.step()
        run = loss if step == 1 else 0.9 * run + 0.1 * loss
        if step % 25 == 0 or step == steps:
            history.append({"step": step, "loss": run})
            if verbose:
                print("step %d/%d  loss %.3f" % (step, steps, run))
    seconds = time.time() - t0
    acc = accuracy(model, test_ids, S)
    text, _ = generate(model, chars, prompt, n)
    tps, tps_recompute = decode_speed(model)
    result = {"backend": mf.get_backend(), "steps": steps, "test_acc": acc, "tokens_per_s": tps,
              "tokens_per_s_recompute": tps_recompute,
              "s_per_step": seconds / max(1, steps), "sample": text, "history": history,
              "kv_bytes_per_token": mf.kv_bytes_per_token(model), "model": model, "chars": chars}
    if verbose:
        print("backend %s: held-out next-char accuracy %.1f%%, %.1f ms/step" %
              (result["backend"], 100 * acc, 1000 * result["s_per_step"]))
        print("decoding: %.0f tokens/s with the KV cache (%d bytes/token), %.0f tokens/s recomputing the prefix"
              % (tps, result["kv_bytes_per_token"], tps_recompute))
        print("sample: %r" % text)
    return result


if __name__ == "__main__":
    main()
