"""make demo: a host-pretrained Iris model meets a drifting sensor, and is fine-tuned on the board.

    python host/tools/demo.py [--port /dev/ttyACM0] [--checkpoint build/iris.mfck]

Deploys to the board (the virtual board when no port is given), then drives the REPL session in
board/finetune.py over mpremote, step by step: accuracy on the drifted sensor before, on-board
fit on a few labelled readings, accuracy after, save, soft reset, reload, same accuracy.

The demo works in its own folder on the board, /demo (finetune.DEMO_DIR): its checkpoint, a
fresh copy of the host's pretrained one each run, and its own examples. The user's /model.mfck
and /data/user.csv are not touched (the checkpoint is copied to /model.mfck only when the board
has none).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import mpremote, resolve_port  # noqa: E402
from deploy import deploy  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / d) for d in ("lib", "board")]
from finetune import DEMO_DIR, DEMO_PRETRAINED  # noqa: E402  (the board's own names)

STEPS = [
    ("The host-pretrained model, on 30 held-out flowers as the drifting sensor reads them "
     "(every reading scaled and offset per feature)",
     False,
     "import finetune\n"
     "s = finetune.demo_session()      # /demo: the demo's own checkpoint and examples\n"
     "held = s.drifted_examples(part='test')\n"
     "before = s.evaluate(held)"),
    ("Label 24 readings from the drifted sensor and fine-tune on the board "
     "(attention and head frozen; the first layer absorbs the drift)",
     True,
     "s.add_examples(s.drifted_examples(24))\n"
     "s.freeze('attention', 'head')\n"
     "s.fit(epochs=finetune.FIT_EPOCHS)\n"
     "after = s.evaluate(held)\n"
     "s.save()"),
    ("Soft reset, then a fresh session reloads the checkpoint and the user examples from flash",
     False,
     "import finetune\n"
     "s = finetune.demo_session(fresh=False)\n"
     "s.evaluate(s.drifted_examples(part='test'))\n"
     "s.evaluate('test')"),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--checkpoint", default="build/iris.mfck")
    a = ap.parse_args(argv)
    if not Path(a.checkpoint).exists():
        raise SystemExit("%s not found: `make pretrain` writes it" % a.checkpoint)
    t0 = time.time()
    port = resolve_port(a.port)
    print("== deploy to %s" % port)
    # the demo's own pretrained copy each run; /model.mfck only if the board has none
    deploy(port, a.checkpoint, checkpoint_mode="missing",
           extra=[(a.checkpoint, "/%s/%s" % (DEMO_DIR, DEMO_PRETRAINED))])
    for i, (title, keep_state, code) in enumerate(STEPS, 1):
        print("\n== %d. %s" % (i, title))
        print("".join(">>> " + line + "\n" for line in code.splitlines()), end="")
        # `resume` keeps the REPL state of the previous step; without it mpremote soft-resets first
        args = (["resume"] if keep_state else []) + ["exec", code]
        sys.stdout.write(mpremote(port, *args, timeout=600))
    print("\n== done in %.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
