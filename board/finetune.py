# finetune.py: fine-tune a pretrained model on the board, from the REPL (MicroPython or CPython).
#   >>> import finetune
#   >>> finetune.help()                  # the commands, with their arguments
#   >>> s = finetune.Session()           # model + checkpoint + data from flash
# The session lives in mf_session.py, the user-example store in mf_examples.py, the drift demo
# in mf_demo.py and mf_drift.py (imported on first use). `make deploy` sends them precompiled
# (.mpy, which drops docstrings): the help text below is a string, so help() works on the board too.
from mf_session import (CHECKPOINT, DATA_DIR, USER_DATA, FIT_EPOCHS, FIT_LR, KINDS, PARTS,  # noqa: F401
                        SELECTIONS, Session)

# The drift demo's names, imported on first use: a session that never runs the demo keeps its
# modules off the heap (a board without PSRAM has a small one).
_LAZY = {"DEMO_DIR": "mf_demo", "DEMO_PRETRAINED": "mf_demo", "FREEZE": "mf_demo", "demo": "mf_demo",
         "demo_session": "mf_demo", "DRIFT_SCALE": "mf_drift", "DRIFT_OFFSET": "mf_drift",
         "drift": "mf_drift"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError("module 'finetune' has no attribute '%s'" % name)
    try:                           # import statements: host/tools/package.py follows them
        if mod == "mf_demo":
            import mf_demo as m
        else:
            import mf_drift as m
    except ImportError as e:       # the text says what failed: MicroPython keeps no chained cause
        raise ImportError("%s (for finetune.%s) failed to import: %s" % (mod, name, e))
    v = globals()[name] = getattr(m, name)      # bound here once: later uses skip this function
    return v

HELP = """finetune: fine-tune the checkpoint on flash, from the REPL
  s = finetune.Session(checkpoint='model.mfck', data=None, user_data='data/user.csv',
                       lr=0.02, batch_size=16, root=None, backend=None, verbose=True,
                       adapter=None)
  s = finetune.Session('iris.mfck')   another checkpoint on flash
  s = finetune.Session(adapter='model.adapter.mfck')
                                  the checkpoint + a LoRA adapter saved for it (s.save_adapter)
  s.help()                        the session's commands
  finetune.capture(s, read, label, n=None, rate_hz=50, count=1)
                                  examples from a sensor: read() returns one reading (a number
                                  or C numbers); a window model's example is L readings
  finetune.demo(root=None, n=24, epochs=10, seed=0)
                                  the Iris drift story in /demo (your files are not touched)
  finetune.demo_session(fresh=True, root=None, verbose=True)
                                  a Session on the demo's own files
Files on flash (relative to the board's cwd '/'; Session(root=...) prefixes them):
  model.mfck        the checkpoint `make deploy CHECKPOINT=path` copies: weights + meta (spec,
                    task, classes or targets, input_shape, features, mean/std, data, split seed,
                    n_train, history of on-board fits)
  data/<meta data>  the base data the model was trained on (header line, label last), when the
                    metadata names it ('data'); Session(data='data/x.csv') names another
  data/user.csv     your examples, raw units; add_example appends, clear_examples() moves the
                    file to data/user.csv.bak (then .bak2, ...)
  model.adapter.mfck  s.save_adapter()'s file: only the trained tensors, for model.mfck alone
  demo/             demo()'s own files (its checkpoint and examples)"""


def help():
    """Print the module's commands (finetune.HELP)."""
    print(HELP)


def capture(session, read, label, n=None, rate_hz=50, count=1, verbose=None):
    """mf_capture.capture (examples from a sensor), imported on first use."""
    from mf_capture import capture as _capture
    return _capture(session, read, label, n, rate_hz, count, verbose)
