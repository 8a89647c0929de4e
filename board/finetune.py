# finetune.py: fine-tune a pretrained model on the board, from the REPL (MicroPython or CPython).
#   >>> import finetune
#   >>> finetune.help()                  # the commands, with their arguments
#   >>> s = finetune.Session()           # model + checkpoint + data from flash
# The session lives in mf_session.py, the user-example store in mf_examples.py, the drift demo
# in mf_demo.py. `make deploy` sends them precompiled (.mpy, which drops docstrings): the help
# text below is a string, so help() works on the board too.
from mf_session import (CHECKPOINT, DATA, USER_DATA, FIT_EPOCHS, FIT_LR, PARTS, SELECTIONS,  # noqa: F401
                        Session)
from mf_demo import (DEMO_DIR, DEMO_PRETRAINED, DRIFT_SCALE, DRIFT_OFFSET, FREEZE,  # noqa: F401
                     demo, demo_session, drift)

HELP = """finetune: fine-tune the checkpoint on flash, from the REPL
  s = finetune.Session(checkpoint='iris.mfck', data='data/iris.csv', user_data='data/user.csv',
                       lr=0.02, batch_size=16, root=None, backend=None, verbose=True)
  s.help()                        the session's commands
  finetune.demo(root=None, n=24, epochs=10, seed=0)
                                  the drift story in /demo (your files are not touched)
  finetune.demo_session(fresh=True, root=None, verbose=True)
                                  a Session on the demo's own files
Files on flash (relative to the board's cwd '/'; Session(root=...) prefixes them):
  iris.mfck         the checkpoint: weights + meta (spec, classes, features, mean/std, split
                    seed, accuracies, history of on-board fits); host/pretrain.py writes it
  data/iris.csv     the base dataset the host pretrained on (header line, label name last)
  data/user.csv     your examples, raw units; add_example appends, clear_examples() moves the
                    file to data/user.csv.bak (then .bak2, ...)
  demo/             demo()'s own files (its checkpoint and examples)"""


def help():
    """Print the module's commands (finetune.HELP)."""
    print(HELP)
