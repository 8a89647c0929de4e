# Real Ctrl-C (SIGINT from the host) during training: after each interrupt the loop goes on from
# the step counter; at the end the weights, moments and counter equal an uninterrupted replay of
# that many steps, bit for bit.   micropython tests/mp/sigint_mp.py BACKEND N_INTERRUPTS
import sys

import microformer as mf
from microformer.models import iris_model
from microformer.train import train_step


def build():
    model = iris_model(1)
    return model, mf.Adam(model, lr=1e-3)


def batches(n=5, B=16):
    r = mf.Rng(11)
    out = []
    for _ in range(n):
        X = mf.Tensor.from_list([[r.uniform(-2, 2) for _ in range(4)] for _ in range(B)])
        out.append((X, [r.randint(3) for _ in range(B)]))
    return out


def state(model, opt):
    out = [bytes(p.data) for _, p in model.named_params()]
    for t in opt.m + opt.v:
        out.append(bytes(t.data))
    return out


def main():
    mf.set_backend(sys.argv[1])
    want = int(sys.argv[2])
    data = batches()
    model, opt = build()
    ce = mf.CrossEntropyLoss()
    kis = 0
    other = 0
    print("READY")
    while kis < want:
        try:
            while True:
                X, y = data[opt.steps % len(data)]
                train_step(model, ce, opt, X, y)
        except KeyboardInterrupt:
            kis += 1
            print("KI %d at step %d" % (kis, opt.steps))
        except Exception as e:
            other += 1
            print("OTHER %s: %s" % (type(e).__name__, e))
            break
    steps = opt.steps
    got = state(model, opt)
    model, opt = build()
    for k in range(steps):
        X, y = data[k % len(data)]
        train_step(model, ce, opt, X, y)
    print("RESULT steps %d interrupts %d other %d same %d" % (steps, kis, other, 1 if state(model, opt) == got else 0))


main()
