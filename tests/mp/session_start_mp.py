# What a plain fine-tune session loads: `import finetune`, then Session on the Iris checkpoint,
# a one-epoch fit and evaluate leave the rarer modules unloaded; each still resolves on first
# use, to the object its module defines. Runs under CPython and inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/session_start_mp.py FLASH
# FLASH holds model.mfck and data/iris.csv. Prints LOADED / SAME lines (tests/mp/test_session_start.py).
import sys

# modules a session on a Dense/attention classifier that only fits and evaluates never needs
RARE = ("mf_demo", "mf_drift", "mf_commands", "mf_adapter", "mf_capture", "mf_methods", "mf_exfile",
        "microformer.attnpaths",
        "microformer.dropout",
        "microformer.viper_norm", "microformer.viper_conv", "microformer.viper_sequence", "microformer.viper_q8",
        "microformer.decoder", "microformer.block",
        "microformer.conv", "microformer.pool1d", "microformer.lora", "microformer.quant",
        "microformer.heatmap", "microformer.parts", "microformer.norm", "microformer.feedforward", "microformer.embedding",
        "microformer.posenc", "microformer.posembed", "microformer.stream", "microformer.golden")


def loaded():
    return sorted(m for m in RARE if m in sys.modules)


# which loaders are still there when the session builds the model from its spec (it imports
# microformer.spec for that): specplan, which only checked the spec, is gone on MicroPython
import builtins  # noqa: E402
_import = builtins.__import__
AT_SPEC = []


def _watch(name, *args):
    if name == "microformer.spec" and not AT_SPEC:
        AT_SPEC.append(sorted(m for m in ("microformer.checkpoint", "microformer.meta", "microformer.specplan")
                              if m in sys.modules))
    return _import(name, *args)


import finetune  # noqa: E402
print("LOADED import", loaded())
builtins.__import__ = _watch
s = finetune.Session(root=sys.argv[1], verbose=False)
builtins.__import__ = _import
print("ATSPEC", sys.implementation.name, AT_SPEC)
s.fit(epochs=1, data="train", verbose=False)
r = s.evaluate(verbose=False)
print("LOADED session", loaded())
# the modules only loading needs: dropped on MicroPython once the session is loaded, kept by CPython
print("LOADONLY", sys.implementation.name,
      sorted(m for m in ("microformer.spec", "microformer.specformat", "microformer.specplan", "microformer.csvfile",
                         "mf_load") if m in sys.modules))
# the modules only a successful load needs (mf_session.LOAD_ONLY_AFTER: the checkpoint, the
# metadata's checks) and the memory plan fit chose its micro-batch with (mf_session.FIT_ONLY): dropped on
# MicroPython, kept by CPython (which never plans a micro-batch: no memplan)
print("AFTERLOAD", sys.implementation.name,
      sorted(m for m in ("microformer.checkpoint", "microformer.meta", "microformer.memplan") if m in sys.modules))
print("ACCURACY", r["accuracy"])
p = s.predict([5.1, 3.5, 1.4, 0.2], verbose=False)
import mf_commands  # noqa: E402
import mf_demo  # noqa: E402
import mf_drift  # noqa: E402
# the session's rarer methods (mf_methods.py): the first one loads the module and binds them all to
# Session, the plan it prints is the one a fit makes
plan = s.plan(verbose=False)
import mf_methods  # noqa: E402
print("METHODS", all(getattr(finetune.Session, n) is getattr(mf_methods.Methods, n) for n in mf_methods.METHODS),
      plan["batch"], plan["peak"] > 0, s.frozen(), len(s.parts(verbose=False)))
print("SAME", finetune.demo is mf_demo.demo, finetune.DEMO_DIR is mf_demo.DEMO_DIR,
      finetune.drift is mf_drift.drift, type(p) is mf_commands.Prediction, p.label in s.classes)
try:
    finetune.no_such_name
except AttributeError as e:
    print("ATTR", "no_such_name" in str(e))
# a load that fails on the checkpoint keeps its modules: the error is the class the package names
# (the checkpoint module dropped by the session above is imported again by this one)
import microformer as mf  # noqa: E402
with open(sys.argv[1].rstrip("/") + "/bad.mfck", "wb") as f:
    f.write(b"MFCK" + bytes(40))
try:
    finetune.Session(checkpoint="bad.mfck", root=sys.argv[1], verbose=False)
except mf.CheckpointError as e:
    print("CAUGHT", "bad.mfck" in str(e))
# a load that fails on the metadata once the data file is read (n_train 120 of 3 rows) keeps the
# metadata's checks loaded: the error is the class `microformer.meta.MetaError` names
with open(sys.argv[1].rstrip("/") + "/data/three.csv", "w") as f:
    f.write("sepal_length,sepal_width,petal_length,petal_width,label\n"
            + "5.1,3.5,1.4,0.2,setosa\n" * 3)
try:
    finetune.Session(data="data/three.csv", root=sys.argv[1], verbose=False)
except Exception as e:
    import microformer.meta  # noqa: E402
    print("CAUGHTMETA", isinstance(e, microformer.meta.MetaError), "n_train" in str(e))
