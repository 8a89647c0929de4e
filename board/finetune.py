# finetune.py: fine-tune a pretrained model on the board, from the REPL (MicroPython or CPython).
#   >>> import finetune
#   >>> finetune.help()                  # the commands, with their arguments
#   >>> s = finetune.Session()           # model + checkpoint + data from flash
# The session lives in mf_session.py, the user-example store in mf_examples.py, the drift demo
# in mf_demo.py and mf_drift.py (imported on first use). `make deploy` sends them precompiled
# (.mpy, which drops docstrings): the help texts are strings (mf_commands.HELP, loaded by
# help()), so help() works on the board too.
from microformer.tensor import settle_gc, unsettle_gc

# the session's modules imported with the GC collecting every tensor.SETTLE_GC_BYTES (MicroPython;
# as microformer's own imports): their code lands together, the free heap stays in large blocks
_gc = settle_gc()
try:
    from mf_session import (CHECKPOINT, DATA_DIR, USER_DATA, FIT_EPOCHS, FIT_LR,  # noqa: F401
                            SELECTIONS, Session)
finally:
    unsettle_gc(_gc)
    del _gc

# The drift demo's names, the kinds of parts freeze takes and the help text, imported on first
# use: a session that never runs the demo, freezes or asks for help keeps their modules off the
# heap (a board without PSRAM has a small one).
_LAZY = {"DEMO_DIR": "mf_demo", "DEMO_PRETRAINED": "mf_demo", "FREEZE": "mf_demo", "demo": "mf_demo",
         "demo_session": "mf_demo", "DRIFT_SCALE": "mf_drift", "DRIFT_OFFSET": "mf_drift",
         "drift": "mf_drift", "KINDS": "microformer.parts", "PARTS": "microformer.parts",
         "HELP": "mf_commands"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError("module 'finetune' has no attribute '%s'" % name)
    try:                           # import statements: host/tools/package.py follows them
        if mod == "mf_demo":
            import mf_demo as m
        elif mod == "mf_drift":
            import mf_drift as m
        elif mod == "mf_commands":
            import mf_commands as m
        else:
            from microformer import parts as m
    except ImportError as e:       # the text says what failed: MicroPython keeps no chained cause
        raise ImportError("%s (for finetune.%s) failed to import: %s" % (mod, name, e))
    v = globals()[name] = getattr(m, name)      # bound here once: later uses skip this function
    return v


def help():
    """Print the module's commands (finetune.HELP, kept in mf_commands)."""
    print(__getattr__("HELP"))


def capture(session, read, label, n=None, rate_hz=50, count=1, verbose=None):
    """mf_capture.capture (examples from a sensor), imported on first use."""
    from mf_capture import capture as _capture
    return _capture(session, read, label, n, rate_hz, count, verbose)
