# LoRA in the board session, under CPython and inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/adapter_mp.py FLASH_A FLASH_B
# FLASH_A, FLASH_B: folders holding what `make deploy` puts on a board (the Iris model.mfck and
# data/iris.csv). Prints ADAPTER OK or raises AssertionError (tests/mp/test_adapter_session.py).
import gc
import sys

import finetune
import microformer as mf
from microformer import checkpoint


def probs(s, rows):
    out = []
    for x in rows:
        out.append(s.predict(x, verbose=False)["probs"])
    return out


ROWS = [[5.9, 3.0, 5.1, 1.8], [5.1, 3.5, 1.4, 0.2], [6.3, 2.5, 4.9, 1.5], [6.0, 2.2, 5.0, 1.5]]


def run(a, b):
    r = {}
    s = finetune.Session(root=a, verbose=True)
    r["before"] = s.evaluate(verbose=False)["accuracy"]
    full_need = s.need["total_bytes"]
    names = s.lora(rank=4, alpha=8)
    r["names"] = names
    r["need"] = s.need
    r["full_need"] = full_need
    s.fit(epochs=3, data="train", verbose=False)
    r["after"] = s.evaluate(verbose=False)["accuracy"]
    r["p_trained"] = probs(s, ROWS)
    r["adapter_bytes"] = s.save_adapter()
    r["base_bytes"] = checkpoint.read_header(a + "/model.mfck")["size"]
    # a checkpoint of the adapted model rebuilds it (adapters from the spec) bit for bit
    s.save("adapted.mfck")
    want = [(n, bytes(p.data)) for n, p in s.model.named_params()]
    again = mf.load_model(a + "/adapted.mfck")
    r["spec_same"] = [(n, bytes(p.data)) for n, p in again.named_params()] == want
    again = want = None
    s = None                # one session at a time, as on a board's heap
    gc.collect()
    fresh = finetune.Session(root=a, verbose=False, adapter="model.adapter.mfck")
    r["p_reloaded"] = probs(fresh, ROWS)
    # merging gives the adapted outputs (within float rounding) and a plain model
    r["merged"] = fresh.merge()
    r["p_merged"] = probs(fresh, ROWS)
    fresh = None
    gc.collect()
    # another base: B's checkpoint after a full fit is not the one the adapter was saved for
    other = finetune.Session(root=b, verbose=False)
    other.fit(epochs=1, data="train", verbose=False)
    try:                    # an adapter names a checkpoint: a fitted, unsaved base is refused
        other.lora()
        r["dirty"] = "no error"
    except ValueError as e:
        r["dirty"] = str(e)
    other.save()
    try:
        finetune.Session(root=b, verbose=False, adapter=a + "/model.adapter.mfck")
        r["refused"] = "no error"
    except checkpoint.CheckpointError as e:
        r["refused"] = str(e)
    return r


def check(r):
    assert r["names"] == ["3.q_proj", "3.k_proj", "3.v_proj", "3.out_proj"], r["names"]  # Attention at 3
    assert r["after"] >= r["before"], (r["before"], r["after"])
    live = r["need"]["trainable"]
    assert live == 4 * 4 * (8 + 8), live          # four r=4 adapters on 8x8 projections
    assert r["need"]["total_bytes"] < r["full_need"], (r["need"], r["full_need"])
    assert r["p_reloaded"] == r["p_trained"], (r["p_reloaded"], r["p_trained"])
    assert r["adapter_bytes"] < r["base_bytes"], (r["adapter_bytes"], r["base_bytes"])
    assert "expected base CRC" in r["refused"], r["refused"]
    assert "s.save() first" in r["dirty"], r["dirty"]
    assert r["spec_same"]
    assert r["merged"] == 4
    for p, q in zip(r["p_merged"], r["p_trained"]):
        for u, v in zip(p, q):
            assert abs(u - v) <= 1e-4, (r["p_merged"], r["p_trained"])


def main(argv):
    r = run(argv[1], argv[2])
    check(r)
    print("ADAPTER OK acc %.4f -> %.4f, adapter %d bytes of %d, need %d bytes (full %d)"
          % (r["before"], r["after"], r["adapter_bytes"], r["base_bytes"], r["need"]["total_bytes"],
             r["full_need"]))


if __name__ == "__main__":
    main(sys.argv)
