"""memplan.pick_micro on CPython (the plan reads the layers' declared buffers there): the largest
micro-batch whose plan fits the free bytes with its headroom on the activations, else one row when
one row's plan fits without it, else None. The expected bytes come from the plan's parts, summed
here."""
import microformer as mf
from microformer import memplan
from microformer.train import Trainer


def _trainer():
    mf.seed(2)
    model = mf.Sequential([mf.Dense(6, 32), mf.ActivationLayer("relu"), mf.Dense(32, 3)])
    return Trainer(model, mf.CrossEntropyLoss(), None, batch_size=8, input_shape=(6,))


def _need(info, have, headroom):
    big = info["activations"] + info["batch_rows"]
    rest = (info["weights"] + info["grads"] + info["optimizer"] + info["snapshot"]) - have
    return rest + big * headroom


def test_pick_micro_puts_the_headroom_on_the_activations_and_falls_back_to_one_row():
    t = _trainer()
    have = memplan.held(t)
    whole = t.plan(8, 8)
    one = t.plan(8, 1)
    assert one["activations"] < whole["activations"]
    h = memplan.HEADROOM
    assert memplan.pick_micro(t, 8, int(_need(whole, have, h)) + 1) == 8
    assert memplan.pick_micro(t, 8, int(_need(whole, have, h)) - 1) == 4
    # one row: fits with the headroom, then only without it, then not at all
    assert memplan.pick_micro(t, 8, int(_need(one, have, h)) + 1) == 1
    assert memplan.pick_micro(t, 8, int(_need(one, have, 1.0)) + 1) == 1
    assert memplan.pick_micro(t, 8, int(_need(one, have, 1.0)) - 1) is None
    # the headroom counts the activations and batch rows only: the optimizer's bytes once
    assert _need(one, have, h) - _need(one, have, 1.0) == (one["activations"] + one["batch_rows"]) * (h - 1)
