"""The MicroPython side of tests/mp/test_optim_fast.py: the whole-step optimizer kernels (adam_step,
sgd_step, params_commit) of the viper backend on each case; new weights and state as hex float32
bits, the flag, and whether the live buffers stayed as they were.

    MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/optim_cases_mp.py CASES.json RESULTS.json [CHECKED_DIR]
"""
from array import array

import microformer as mf
from kernel_cases_mp import V, f32, hx, main, z


def pairs(c):
    out = []
    for p, g in zip(c["p"], c["g"]):
        pd = f32(p)
        out.append((mf.Tensor((len(pd),), pd), mf.Tensor((len(pd),), f32(g))))
    return out


def run(c):
    ps = pairs(c)
    before = [hx(p.data) + hx(g.data) for p, g in ps]
    N = sum(len(p.data) for p, _ in ps)
    r = {}
    if c["kind"] == "adam":
        m = f32(c["m"]); v = f32(c["v"])
        m0 = hx(m) + hx(v)
        np_ = z(N); nm = z(N); nv = z(N)
        t = c["t"]
        r["flag"] = V.adam_step(np_, [nm, nv], ps, [m, v], [c["lr"], c["b1"], c["b2"], c["eps"], c["wd"],
                                                           c["dec"], t])
        r["p"] = hx(np_); r["m"] = hx(nm); r["v"] = hx(nv)
        r["live_same"] = (m0 == hx(m) + hx(v))
    else:
        buf = f32(c["b"]) if c["mom"] else None
        b0 = hx(buf) if buf else ""
        np_ = z(N); nb = z(N) if buf else None
        r["flag"] = V.sgd_step(np_, [nb] if buf else [], ps, [buf] if buf else [], [c["lr"], c["mom"], c["wd"]])
        r["p"] = hx(np_); r["b"] = hx(nb) if nb else ""
        r["live_same"] = (b0 == (hx(buf) if buf else ""))
    r["live_same"] = r["live_same"] and before == [hx(p.data) + hx(g.data) for p, g in ps]
    if r["flag"] < 0:
        V.params_commit(ps, np_, len(ps))
        r["committed"] = hx(array('f', b''.join(bytes(p.data) for p, _ in ps)))
    return r


main(run)
