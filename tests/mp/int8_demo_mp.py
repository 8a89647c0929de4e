# Accuracy with int8 frozen weights against float32 ones, on the demos (a measurement; the
# figures go into lib/README.md "Fine-tuning within a budget"):
#   MICROPYPATH=lib:board:board/demos:board/benchmarks micropython tests/mp/int8_demo_mp.py FLASH [SENSOR_CKPT DATA_DIR]
#   PYTHONPATH=lib:board:board/demos:board/benchmarks python tests/mp/int8_demo_mp.py FLASH [SENSOR_CKPT DATA_DIR]
# FLASH: a folder as `make deploy` fills it (model.mfck: the pretrained Iris model, data/iris.csv).
# Iris drift demo (board/mf_demo.py): the same fine-tune (freeze attention + head, 24 drifted
# examples, the session's epochs), then LoRA r=4 on the attention, each with float32 and with
# int8 frozen weights. Sensor demo (board/demos/sensor.py's checkpoint): held-out accuracy, then a
# 3-epoch fine-tune of the head with everything else frozen, float32 and int8.
import sys

import microformer as mf
from microformer import quant

FLASH = sys.argv[1]
SENSOR = sys.argv[2] if len(sys.argv) > 2 else None
DATA = sys.argv[3] if len(sys.argv) > 3 else None


def iris(mode, how):
    import mf_demo
    s = mf_demo.demo_session(fresh=True, root=FLASH, verbose=False)
    held = s.drifted_examples(part="test")
    s.add_examples(s.drifted_examples(24, seed=0))
    if how == "demo":
        s.freeze(*mf_demo.FREEZE)
    else:
        s.lora(rank=4, alpha=8)
    wb = quant.weight_bytes(s.model)
    if mode == "int8":
        s.int8()
    wa = quant.weight_bytes(s.model)
    s.fit(verbose=False)
    acc = s.evaluate(held, verbose=False)["accuracy"]
    base = s.evaluate("test", verbose=False)["accuracy"]
    print("iris %-5s %-7s drifted held-out %.1f%%  undrifted test %.1f%%  weights %d -> %d bytes"
          % (how, mode, 100 * acc, 100 * base, wb, wa))


def sensor(mode):
    import sensor as S
    from microformer.loss import CrossEntropyLoss
    from microformer.optim import Adam
    from microformer.train import evaluate, fit
    model, meta = mf.load_model(SENSOR, with_meta=True)
    train = S.standardize(S.load(S.TRAIN, DATA), meta["mean"], meta["std"])
    test = S.standardize(S.load(S.TEST, DATA), meta["mean"], meta["std"])
    model.trainable = False
    model[-1].trainable = True
    wb = quant.weight_bytes(model)
    if mode == "int8":
        quant.int8(model, show=False)
    wa = quant.weight_bytes(model)
    acc0 = evaluate(model, test, 8)[0]
    fit(model, CrossEntropyLoss(), Adam(model.parameters(), lr=5e-4), train, epochs=3, batch_size=8, seed=1,
        verbose=False)
    acc1 = evaluate(model, test, 8)[0]
    print("sensor %-7s held-out %.1f%% before, %.1f%% after 3 head epochs; weights %d -> %d bytes"
          % (mode, 100 * acc0, 100 * acc1, wb, wa))


print("backend", mf.get_backend())
for how in ("demo", "lora"):
    for mode in ("float32", "int8"):
        iris(mode, how)
if SENSOR:
    for mode in ("float32", "int8"):
        sensor(mode)
