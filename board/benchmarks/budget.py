# budget.py: fine-tuning within a budget: what one fine-tuning mode costs (heap, steps) and
# what it recovers on a drift task, on the sensor model and on a two-EncoderBlock encoder.
#   micropython budget.py ACTION MODEL MODE CHECKPOINT [N] [DATA_DIR]
# ACTION: epoch (one fine-tuning epoch, nothing measured: what the smallest heap must hold),
# peak (the heap high-water of that epoch), steps N (N training steps: for instruction counts),
# accuracy N (N epochs, then held-out accuracy, adapter size, weight memory).
#   micropython budget.py goal encoder|gesture|decode [MODE [checkpoint]]   (the memory goals: action_goal)
# MODEL: sensor (board/demos/sensor.py: BasicMotions windows, Conv1D + EncoderBlock, 16 wide) or
# encoder (two EncoderBlocks, E=64, H=4, S=32, about 100k parameters, on ENCODER's synthetic task).
# MODE: full, head, bias_norm, lora, lora_int8 (see MODES). host/bench/bench_budget.py runs this file in
# the unix ports and parses the lines that start with BUDGET.
import gc
import sys

import microformer as mf
from microformer import lora as L
from microformer.data import Dataset, Batches
from microformer.loss import CrossEntropyLoss
from microformer.optim import Adam
from microformer.tensor import Rng, Tensor
from microformer.train import evaluate, fit, train_step

_mem_alloc = getattr(gc, "mem_alloc", None)           # MicroPython only

MODES = ("full", "head", "bias_norm", "lora", "lora_int8")
WHAT = {"full": "full fine-tune", "head": "head only", "bias_norm": "bias + LayerNorm only",
        "lora": "LoRA r=4 (attention + FFN) + head", "lora_int8": "LoRA r=4 + head, int8 frozen weights"}
RANK = 4
ALPHA = 8
# Adam's learning rate per mode: the full fine-tune at the rate the demos fine-tune with, the
# modes that train few parameters (head, bias + LayerNorm, adapters) at 5x it, as is usual for
# them (peft's LoRA recipes train adapters at several times the full fine-tune's rate)
LR = {"full": 1e-3, "head": 5e-3, "bias_norm": 5e-3, "lora": 5e-3, "lora_int8": 5e-3}
BATCH = 8
QUANT_MISSING = "not available: microformer.quant missing"

# ---- the encoder's task --------------------------------------------------------------------
# A synthetic multichannel sequence, seeded (the microformer xorshift: the same numbers on
# CPython and every MicroPython port). S=32 steps of C=16 channels, 4 classes. Class k's template
# is a sum of two sines per channel whose frequencies (1..3 cycles per window) and phases are drawn
# from ENC_SEED; only ENC_INFORMATIVE channels differ between classes (the others share class 0's
# template). A sample is its class template rolled by a random 0..7 steps, with uniform noise of
# standard deviation ENC_NOISE. The drift: a miscalibrated front end reads every channel c as
# x * ENC_GAIN[c] + ENC_OFFSET[c], and swaps channels 0 and 1 (a rewired sensor).
ENC_S = 32
ENC_C = 16
ENC_E = 64
ENC_CLASSES = ["a", "b", "c", "d"]
ENC_SEED = 7
ENC_INFORMATIVE = 4
ENC_NOISE = 1.5
ENC_GAIN = (1.6, 0.5, 1.3, 0.7, 1.5, 0.6, 1.2, 0.8, 1.4, 0.7, 1.1, 0.9, 1.3, 0.6, 1.5, 0.8)
ENC_OFFSET = (0.8, -0.6, 0.5, -0.9, 0.4, 0.7, -0.5, 0.6, -0.8, 0.3, 0.9, -0.4, 0.5, -0.7, 0.6, -0.3)
ENC_SWAP = (0, 1)
# the splits: (seed, rows); pretraining reads undrifted rows, fine-tuning and the held-out test
# drifted ones (other seeds: other rows)
ENC_PRETRAIN = (11, 1024)
ENC_PRETEST = (12, 256)
ENC_FINETUNE = (13, 64)
ENC_TEST = (14, 256)

# ---- the sensor's drift ----------------------------------------------------------------------
# BasicMotions windows standardized with the checkpoint's statistics, then read by a watch whose
# accelerometer and gyroscope are miscalibrated: channel c (acc_x, acc_y, acc_z, gyro_x, gyro_y,
# gyro_z) becomes x * SENSOR_GAIN[c] + SENSOR_OFFSET[c] (standardized units). Fine-tuning reads
# the drifted training split, the held-out accuracy the drifted test split.
SENSOR_GAIN = (1.5, 0.6, 1.3, 0.5, 1.4, 0.7)
SENSOR_OFFSET = (0.8, -0.7, 0.6, 0.9, -0.8, 0.5)


def _sin(x):
    import math
    return math.sin(x)


def _templates():
    rng = Rng(ENC_SEED)
    two_pi = 6.283185307179586
    tpl = []
    for k in range(len(ENC_CLASSES)):
        rows = []
        for c in range(ENC_C):
            f1 = 1 + rng.randint(3)
            f2 = 1 + rng.randint(3)
            p1 = rng.uniform(0.0, two_pi)
            p2 = rng.uniform(0.0, two_pi)
            if k and c >= ENC_INFORMATIVE:
                rows.append(tpl[0][c])
            else:
                rows.append([_sin(two_pi * f1 * t / ENC_S + p1) + 0.5 * _sin(two_pi * f2 * t / ENC_S + p2)
                             for t in range(ENC_S)])
        tpl.append(rows)
    return tpl


def encoder_data(split, drifted, rows=None):
    """A Dataset [N, S*C] (time-major rows) of the encoder's task: split (seed, rows), balanced
    over the classes; drifted: as the miscalibrated front end reads it; rows: only the split's
    first `rows` rows."""
    seed, n = split
    if rows is not None:
        n = min(n, rows)
    tpl = _templates()
    rng = Rng(seed)
    X = Tensor((n, ENC_S * ENC_C))
    d = X.data
    y = [0] * n
    a = ENC_NOISE * 1.7320508075688772          # uniform on [-a, a): standard deviation ENC_NOISE
    src = list(range(ENC_C))
    if drifted:
        src[ENC_SWAP[0]], src[ENC_SWAP[1]] = ENC_SWAP[1], ENC_SWAP[0]
    for i in range(n):
        k = i % len(ENC_CLASSES)
        y[i] = k
        shift = rng.randint(8)
        rows = tpl[k]
        o = i * ENC_S * ENC_C
        for t in range(ENC_S):
            tt = (t + shift) % ENC_S
            for c in range(ENC_C):
                v = rows[src[c]][tt] + a * rng.signed_unit()
                if drifted:
                    v = v * ENC_GAIN[c] + ENC_OFFSET[c]
                d[o + t * ENC_C + c] = v
    return Dataset(X, y, ENC_CLASSES)


def encoder_model(seed=3):
    """[B, S*C] -> [B, S, C] -> Dense(C, E) -> learned positions -> 2 x EncoderBlock(E, 4 heads,
    FFN 4E) -> GlobalAvgPool -> Dense(E, 4)."""
    mf.seed(seed)
    return mf.Sequential([mf.Reshape((ENC_S, ENC_C)), mf.Dense(ENC_C, ENC_E),
                          mf.LearnedPositionalEmbedding(ENC_S, ENC_E),
                          mf.EncoderBlock(ENC_E, 4, 4 * ENC_E), mf.EncoderBlock(ENC_E, 4, 4 * ENC_E),
                          mf.GlobalAvgPool(), mf.Dense(ENC_E, len(ENC_CLASSES))])


def sensor_data(which, meta, data_dir=None):
    """BasicMotions split `which` ('train' or 'test'), standardized with the checkpoint's meta,
    drifted by SENSOR_GAIN / SENSOR_OFFSET."""
    import sensor
    data = sensor.load(sensor.TRAIN if which == "train" else sensor.TEST, data_dir)
    sensor.standardize(data, meta["mean"], meta["std"])
    d = data.X.data
    C = sensor.CHANNELS
    for i in range(len(d)):
        c = i % C
        d[i] = d[i] * SENSOR_GAIN[c] + SENSOR_OFFSET[c]
    return data


def data(model_name, which, meta=None, data_dir=None, rows=None):
    """The drifted fine-tuning ('train') or held-out ('test') split of a model's task (rows: the
    encoder's first `rows` rows only)."""
    if model_name == "encoder":
        return encoder_data(ENC_FINETUNE if which == "train" else ENC_TEST, True, rows)
    if model_name == "sensor":
        return sensor_data(which, meta, data_dir)
    raise ValueError("budget: model must be 'sensor' or 'encoder', got %r" % (model_name,))


def quant_module():
    """microformer.quant, or None when this package has none."""
    try:
        from microformer import quant
    except (ImportError, AttributeError) as e:      # the package's lazy __getattr__ says AttributeError
        if "quant" not in str(e):
            raise                                   # an error inside microformer.quant itself
        return None
    return quant


def set_mode(model, mode):
    """Freeze / adapt `model` for fine-tuning mode `mode` (MODES). Returns the names of what
    trains (adapters as their linear maps)."""
    head = len(model.layers) - 1
    if mode == "full":
        return ["all"]
    if mode == "head":
        return L.freeze_except(model, "%d.*" % head)
    if mode == "bias_norm":
        return L.freeze_except(model, "bias", "norm")
    if mode in ("lora", "lora_int8"):
        names = [n for n, _ in L.add_lora(model, rank=RANK, alpha=ALPHA, targets=("attention", "ffn"))]
        model.layers[head].trainable = True                # peft's modules_to_save: the classifier
        return names + ["%d.*" % head]
    raise ValueError("budget: mode must be one of %s, got %r" % (", ".join(MODES), mode))


def int8(model):
    """Every frozen weight matrix to int8 in place (microformer.quant); ImportError naming it
    when this package has no microformer.quant."""
    q = quant_module()
    if q is None:
        raise ImportError(QUANT_MISSING)
    return q.int8(model)


def setup(model_name, mode, checkpoint, data_dir=None, rows=None):
    """(model, meta, data, optimizer, loss) ready to fine-tune; the model's weights are the
    checkpoint's."""
    model, meta = mf.load_model(checkpoint, with_meta=True)
    d = data(model_name, "train", meta, data_dir, rows)
    set_mode(model, mode)
    if mode == "lora_int8":
        int8(model)
    gc.collect()
    return model, meta, d, Adam(model, lr=LR[mode]), CrossEntropyLoss()


def _param_count(model):
    return sum(p.size for p, _ in model.params())


def _report(tag, **kw):
    print("BUDGET " + tag + " " + " ".join("%s=%s" % (k, kw[k]) for k in sorted(kw)))


def action_epoch(model_name, mode, checkpoint, data_dir=None):
    model, _, d, opt, loss_fn = setup(model_name, mode, checkpoint, data_dir)
    fit(model, loss_fn, opt, d, epochs=1, batch_size=BATCH, seed=1, verbose=False)
    _report("epoch", steps=opt.steps)


def action_peak(model_name, mode, checkpoint, data_dir=None):
    """The heap one fine-tuning epoch holds at its peak: `live`, gc.mem_alloc() after the first
    step and a collection (model, data, grads, optimizer state, every buffer the step made: all
    of it stays), plus `garbage`, the most any later step allocates with the GC off (the
    transients of a steady-state step). The first step's own temporaries are not in it (the
    smallest heap that runs the epoch is)."""
    if _mem_alloc is None:
        raise SystemExit("budget peak: this interpreter has no gc.mem_alloc")
    model, _, d, opt, loss_fn = setup(model_name, mode, checkpoint, data_dir)
    gc.collect()
    ready = _mem_alloc()
    live = garbage = steps = 0
    for X, y in Batches(d, BATCH, Rng(2)):
        gc.collect()
        a = _mem_alloc()
        gc.disable()
        try:
            train_step(model, loss_fn, opt, X, y)
            b = _mem_alloc()
        finally:
            gc.enable()
        if steps == 0:
            gc.collect()
            live = _mem_alloc()
        elif b - a > garbage:
            garbage = b - a
        steps += 1
    gc.collect()
    _report("peak", ready=ready, live=live, garbage=garbage, peak=live + garbage, after=_mem_alloc(),
            steps=steps)


def action_steps(model_name, mode, checkpoint, n, data_dir=None):
    """n training steps of BATCH rows (cycling over the data): host/bench/bench_budget.py counts the
    instructions of runs of n and 2n steps (of the encoder's data only one batch is made)."""
    model, _, d, opt, loss_fn = setup(model_name, mode, checkpoint, data_dir, BATCH)
    k = 0
    while k < n:
        for X, y in Batches(d, BATCH):
            if k == n:
                break
            if len(y) == BATCH:
                train_step(model, loss_fn, opt, X, y)
                k += 1
    _report("steps", steps=k, batch=BATCH)


def _weight_bytes():
    gc.collect()
    return _mem_alloc() if _mem_alloc else -1


def action_accuracy(model_name, mode, checkpoint, epochs, data_dir=None, adapter_path=None):
    """Held-out accuracy on the drifted test split before and after `epochs` fine-tuning epochs;
    trainable and total parameters; the adapter file's size against the checkpoint's; the heap
    the model holds (with int8 frozen weights, how much less)."""
    import os
    base = _weight_bytes()
    model, meta = mf.load_model(checkpoint, with_meta=True)
    held_float = _weight_bytes() - base
    train = data(model_name, "train", meta, data_dir)
    test = data(model_name, "test", meta, data_dir)
    acc0, _ = evaluate(model, test, BATCH)
    trains = set_mode(model, mode)
    q_saved = 0
    frozen_w = 0
    q_w = 0
    if mode == "lora_int8":
        # what quant.int8 converted (float32 bytes before, int8 rows + scales after), and the heap
        # the conversion freed: the model with adapters in float32, then with int8 (the Int8Weight
        # objects count too: on a small model they can outweigh what int8 saves)
        quant_module()                   # its code is not the model's: loaded before the count
        held = _weight_bytes()
        for _, before, after in int8(model):
            frozen_w += before
            q_w += after
        q_saved = held - _weight_bytes()
    opt = Adam(model, lr=LR[mode])
    fit(model, CrossEntropyLoss(), opt, train, epochs=epochs, batch_size=BATCH, seed=1, verbose=False)
    acc1, _ = evaluate(model, test, BATCH)
    train_acc, _ = evaluate(model, train, BATCH)
    ck_size = os.stat(checkpoint)[6]
    from microformer import checkpoint as ck
    a_size = -1
    if adapter_path and mode != "full":
        a_size = ck.save_adapter(adapter_path, model, checkpoint)
    _report("accuracy", before=acc0, after=acc1, train=train_acc, epochs=epochs, steps=opt.steps,
            trainable=L.trainable_count(model), params=_param_count(model),
            checkpoint=ck_size, adapter=a_size, model_heap=held_float, q_saved=q_saved, frozen_w=frozen_w, q_w=q_w,
            trains=",".join(trains) if len(trains) < 4 else "%d_names" % len(trains))


# ---- the memory goals (host/bench/bench_budget.py goals) -------------------------------------------
# Each goal runs from a model made here (random weights: memory does not depend on their values):
# encoder MODE: two fit steps of the encoder at an effective batch of BATCH rows through
#   microformer.train.Trainer with micro_batch='auto' (the largest micro-batch whose memory plan
#   fits the free heap), MODE full, lora or lora_int8;
# gesture: two fit steps at GESTURE_BATCH of the model of README.md's From PyTorch block (its
#   GestureNet as microformer layers: Conv1D(3, 16, 5, padding 2), ReLU, EncoderBlock(16, 2, 32,
#   ReLU, dropout 0.1), mean over time, Dense(16, 5)) over 50 x 3 windows, through the trainer the
#   board session's fit runs; gesture_flash() makes the files for the same model's board session
#   (bench_budget.py goals runs finetune.Session on them: the goal as the issue states it);
# decode: decode_goal.py (a causal E=32 character model prefilling 16 tokens and decoding to the
#   end of its 318-token cache); bench_budget.py runs that file itself, without this one's imports.
GESTURE_BATCH = 16


GESTURE_CLASSES = ["still", "wave", "shake", "tap", "swipe"]
GESTURE_ROWS = 50                   # the data file's windows; the last 10 are the test split


def gesture_model():
    mf.seed(5)
    return mf.Sequential([mf.Conv1D(3, 16, 5, padding=2), mf.ActivationLayer("relu"),
                          mf.EncoderBlock(16, 2, 32, activation="relu", dropout=0.1), mf.GlobalAvgPool(),
                          mf.Dense(16, 5)])


def gesture_flash(folder):
    """(checkpoint, data file) of the gesture model's board session in `folder` (CPython): the
    model with the metadata torch_io gives the README's GestureNet (classes, data file, input
    shape, the split the user names) and GESTURE_ROWS seeded windows, a row each (50 readings x 3
    channels, time-major, then the label)."""
    import os
    from microformer import checkpoint
    data = os.path.join(folder, "gesture.csv")
    r = Rng(9)
    with open(data, "w") as f:
        f.write(",".join("t%d_c%d" % (t, c) for t in range(50) for c in range(3)) + ",label\n")
        for i in range(GESTURE_ROWS):
            f.write(",".join("%.4f" % r.signed_unit() for _ in range(150)) + ","
                    + GESTURE_CLASSES[i % len(GESTURE_CLASSES)] + "\n")
    ck = os.path.join(folder, "gesture.mfck")
    checkpoint.save(ck, gesture_model(), meta={
        "task": "classify", "classes": GESTURE_CLASSES, "data": "gesture.csv", "input_shape": [50, 3],
        "features": ["x0", "x1", "x2"], "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
        "split": {"test": list(range(GESTURE_ROWS - 10, GESTURE_ROWS))}})
    return ck, data


def _rows(n, F, C, seed=9):
    X = Tensor((n, F))
    r = Rng(seed)
    for i in range(n * F):
        X.data[i] = r.signed_unit()
    return Dataset(X, [i % C for i in range(n)], [str(c) for c in range(C)])


def action_goal(model_name, mode, checkpoint=False):
    """Two fit steps (encoder, gesture) or a decode (decode), then the plan's peak at the
    micro-batch the fit ran and at the whole batch: BUDGET goal ... checkpoint: every
    EncoderBlock's checkpoint switch on (its backward runs its forward again)."""
    from microformer.train import Trainer
    if model_name == "decode":
        return _goal_decode()
    if model_name == "gesture":
        model, batch, shape = gesture_model(), GESTURE_BATCH, (50, 3)
        d = _rows(2 * batch, 150, 5)
    else:
        model, batch, shape = encoder_model(), BATCH, None
        set_mode(model, mode)
        if mode == "lora_int8":
            int8(model)
        d = encoder_data(ENC_FINETUNE, True, 2 * BATCH)
    for l in model.layers:
        if hasattr(l, "checkpoint"):
            l.checkpoint = checkpoint
    gc.collect()
    t = Trainer(model, CrossEntropyLoss(), None, batch, None, shape, LR.get(mode, 1e-3))
    t.fit(d, epochs=1, micro_batch="auto", verbose=False)
    m = t.last_rows
    # the plan as the fit ran: with the blocks' checkpoint on when the memory plan switched it on
    ck = t.last_checkpoint
    if ck:
        for l in model.layers:
            if hasattr(l, "checkpoint"):
                l.checkpoint = True
    _report("goal", steps=t.optimizer.steps, micro=m, batch=batch, plan_peak=t.plan(batch, m)["peak"],
            plan_whole=t.plan(batch, batch)["peak"], plan_ckpt=int(ck))


def _goal_decode():
    import decode_goal
    decode_goal.run()


def main(argv):
    if len(argv) >= 2 and argv[0] == "goal":
        if len(argv) > 3 and argv[3] != "checkpoint":
            raise SystemExit("usage: budget.py goal MODEL [MODE [checkpoint]], got %r" % (argv[3],))
        action_goal(argv[1], argv[2] if len(argv) > 2 else "full", len(argv) > 3)
        return
    if len(argv) < 4:
        raise SystemExit("usage: budget.py epoch|peak|steps|accuracy MODEL MODE CHECKPOINT [N] [DATA_DIR]")
    action, model_name, mode, checkpoint = argv[:4]
    rest = argv[4:]
    if model_name not in ("sensor", "encoder"):
        raise SystemExit("budget: MODEL must be sensor or encoder, got %r" % (model_name,))
    if mode not in MODES:
        raise SystemExit("budget: MODE must be one of %s, got %r" % (", ".join(MODES), mode))
    if mode == "lora_int8" and quant_module() is None:
        print("BUDGET missing " + QUANT_MISSING)
        return
    if action == "epoch":
        action_epoch(model_name, mode, checkpoint, rest[0] if rest else None)
    elif action == "peak":
        action_peak(model_name, mode, checkpoint, rest[0] if rest else None)
    elif action == "steps":
        action_steps(model_name, mode, checkpoint, int(rest[0]), rest[1] if len(rest) > 1 else None)
    elif action == "accuracy":
        action_accuracy(model_name, mode, checkpoint, int(rest[0]), rest[1] if len(rest) > 1 else None,
                        rest[2] if len(rest) > 2 else None)
    else:
        raise SystemExit("budget: ACTION must be epoch, peak, steps or accuracy, got %r" % (action,))


if __name__ == "__main__":
    main(sys.argv[1:])
