# cost.py: training steps to count instructions per training sample (host/bench/bench_budget.py
# goals runs this file under callgrind twice, for N and 2N steps: the difference is N steps).
#   micropython cost.py MODEL STEPS [MICRO [RECOMPUTE]]
# MODEL: iris (the seed's Iris model, batch 16), encoder-full / encoder-lora (budget.py's E=64
# encoder, batch 8, full fine-tune or LoRA r=4 + head), gesture (budget.py's Conv1D + EncoderBlock
# over 50 x 3 windows, batch 16). STEPS: steps of one batch each (train.fit, one epoch per step:
# one batch of rows, the same rows every step). MICRO: rows per forward/backward (0 or absent:
# the whole batch); RECOMPUTE: auto (the trainer chooses from the memory plan), keep or recompute.
# The model's weights are random (seeded): the instructions of a step do not depend on them.
# Prints "COST model=... steps=... batch=... micro=... recompute=...".
import sys

import microformer as mf
from microformer.loss import CrossEntropyLoss
from microformer.optim import Adam
from microformer.train import fit

import budget

BATCHES = {"iris": 16, "encoder-full": budget.BATCH, "encoder-lora": budget.BATCH,
           "gesture": budget.GESTURE_BATCH}


def setup(name):
    """(model, data of one batch, lr) of cost model `name` (BATCHES)."""
    B = BATCHES[name]
    if name == "iris":
        from microformer.models import iris_model
        return iris_model(1), budget._rows(B, 4, 3), 1e-3
    if name == "gesture":
        g = budget.gesture_model()
        return mf.Sequential([mf.Reshape((50, 3))] + list(g.layers)), budget._rows(B, 150, 5), 1e-3
    mode = name.split("-")[1]
    model = budget.encoder_model()
    budget.set_mode(model, mode)
    return model, budget.encoder_data(budget.ENC_FINETUNE, True, B), budget.LR[mode]


def run(name, steps, micro=0, recompute="auto"):
    model, d, lr = setup(name)
    B = BATCHES[name]
    opt = Adam(model, lr=lr)
    kw = {}
    if micro:
        kw["micro_batch"] = micro
    if recompute != "auto":                    # (a package that chooses nothing takes no argument)
        kw["recompute"] = recompute == "recompute"
    fit(model, CrossEntropyLoss(), opt, d, epochs=steps, batch_size=B, seed=1, verbose=False, **kw)
    chosen = [l.recompute for l in model.layers if hasattr(l, "ffn") and hasattr(l, "recompute")]
    print("COST model=%s steps=%d batch=%d micro=%d recompute=%s" % (
        name, opt.steps, B, micro or B, ("recompute" if chosen[0] else "keep") if chosen else "-"))


def main(argv):
    if len(argv) < 2 or argv[0] not in BATCHES:
        raise SystemExit("usage: cost.py %s STEPS [MICRO [auto|keep|recompute]]" % "|".join(BATCHES))
    run(argv[0], int(argv[1]), int(argv[2]) if len(argv) > 2 else 0, argv[3] if len(argv) > 3 else "auto")


if __name__ == "__main__":
    main(sys.argv[1:])
