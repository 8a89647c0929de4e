# DecoderBlock forward/backward and Transformer generation, under CPython or MicroPython:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/decoder_mp.py cases.json results.json backend
import driver_mp
from array import array

import microformer as mf


def _tensor(spec):
    return mf.Tensor(tuple(spec["shape"]), array("f", spec["data"]))


def _out(t):
    return list(t.data)


def run_block(case):
    E, H, hidden = case["E"], case["H"], case["hidden"]
    blk = mf.DecoderBlock(E, H, hidden, activation=case.get("activation", "gelu"))
    named = {}
    for p, g in blk.params():
        named[p.name] = (p, g)
    for name in case["params"]:
        p, _ = named[name]
        p.data[0:p.size] = array("f", case["params"][name])
    x = _tensor(case["x"])
    m = _tensor(case["memory"])
    out = {}
    for rep in range(2):            # twice: the second pass reuses every buffer
        for p, g in blk.params():
            g.fill(0.0)
        y = blk.forward(x, m, tgt_lengths=case.get("tgt_lengths"), memory_lengths=case.get("memory_lengths"))
        dx = blk.backward(_tensor(case["dy"]))
        dm = blk.dmemory
    out["y"] = _out(y)
    out["dx"] = _out(dx)
    out["dmemory"] = _out(dm)
    for name in named:
        out["d" + name] = _out(named[name][1])
    return out


def run_generate(case):
    mf.seed(case["seed"])
    t = mf.from_spec(case["spec"])
    res = {}
    res["batch"] = t.generate(case["src"], case["src_lengths"], case["bos"], case["max_new"])
    singles = []
    for b in range(len(case["src"])):
        n = case["src_lengths"][b]
        singles.append(t.generate([case["src"][b][:n]], None, case["bos"], case["max_new"])[0])
    res["single"] = singles
    # the full (teacher-forced on its own output) forward's argmax at every position
    tgt = [[case["bos"]] + row[:-1] for row in res["batch"]]
    logits = t.forward(case["src"], tgt, case["src_lengths"])
    B, S, V = logits.shape
    d = logits.data
    full = []
    for b in range(B):
        row = []
        for s in range(S):
            base = (b * S + s) * V
            best = 0
            for v in range(V):
                if d[base + v] > d[base + best]:
                    best = v
            row.append(best)
        full.append(row)
    res["full"] = full
    return res


def run_padded_attention(case):
    # causal self-attention decoding of prompts of different lengths in one padded batch,
    # against each prompt decoded alone
    mf.seed(case["seed"])
    E, H, L = case["E"], case["H"], case["L"]
    a = mf.Attention(E, H, causal=True)
    x = _tensor(case["x"])                 # [B, S, E] prompts (padded at the tail)
    steps = _tensor(case["steps"])         # [B, T, E] new tokens
    B, S, _ = x.shape
    T = steps.shape[1]
    lengths = case["lengths"]
    one = mf.Tensor((B, 1, E))
    a.prefill_padded(x, lengths, max_len=L)
    got = []
    for t in range(T):
        for b in range(B):
            for i in range(E):
                one.data[b * E + i] = steps.data[(b * T + t) * E + i]
        got.append(list(a.decode_step_padded(one).data))
    alone = []
    for b in range(B):
        n = lengths[b]
        xb = mf.Tensor((1, n, E), array("f", x.data[b * S * E: b * S * E + n * E]))
        a.prefill(xb, max_len=L)
        rows = []
        for t in range(T):
            s = mf.Tensor((1, 1, E), array("f", steps.data[(b * T + t) * E: (b * T + t + 1) * E]))
            rows.append(list(a.decode_step(s).data))
        alone.append(rows)
    return {"batch": got, "alone": alone}


def run_block_padded(case):
    # a DecoderBlock decoding prompts of different lengths (padded) over padded memories, against
    # each prompt and memory alone
    mf.seed(case["seed"])
    E, H, L = case["E"], case["H"], case["L"]
    blk = mf.DecoderBlock(E, H, 2 * E)
    x = _tensor(case["x"])
    m = _tensor(case["memory"])
    steps = _tensor(case["steps"])
    B, S, _ = x.shape
    Sk = m.shape[1]
    T = steps.shape[1]
    tl = case["lengths"]
    ml = case["memory_lengths"]
    blk.cache_memory(m, memory_lengths=ml)
    y = blk.prefill(x, L, tgt_lengths=tl)
    pre = [list(y.data[(b * S + tl[b] - 1) * E:(b * S + tl[b]) * E]) for b in range(B)]
    one = mf.Tensor((B, 1, E))
    got = []
    for t in range(T):
        for b in range(B):
            for i in range(E):
                one.data[b * E + i] = steps.data[(b * T + t) * E + i]
        got.append(list(blk.decode_step(one).data))
    alone = []
    alone_pre = []
    for b in range(B):
        mb = mf.Tensor((1, ml[b], E), array("f", m.data[b * Sk * E: b * Sk * E + ml[b] * E]))
        xb = mf.Tensor((1, tl[b], E), array("f", x.data[b * S * E: b * S * E + tl[b] * E]))
        blk.cache_memory(mb)
        yb = blk.prefill(xb, L)
        alone_pre.append(list(yb.data[(tl[b] - 1) * E:]))
        rows = []
        for t in range(T):
            s = mf.Tensor((1, 1, E), array("f", steps.data[(b * T + t) * E: (b * T + t + 1) * E]))
            rows.append(list(blk.decode_step(s).data))
        alone.append(rows)
    return {"batch": got, "alone": alone, "prefill_last": pre, "alone_prefill_last": alone_pre}


def run_case(case):
    kind = case["kind"]
    if kind == "block":
        return run_block(case)
    if kind == "generate":
        return run_generate(case)
    if kind == "block_padded":
        return run_block_padded(case)
    return run_padded_attention(case)


def main(argv):
    driver_mp.main(argv, run_case)


if __name__ == "__main__":
    import sys
    main(sys.argv)
