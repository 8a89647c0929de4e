# selftest.py: check microformer on this board against golden vectors from the host's NumPy reference.
#   >>> import selftest; selftest.run()        (make selftest copies golden/*.mfg and runs it)
# Every stage of the golden attention case (projections, scores before/after scaling, after
# masking, softmax weights, output, every gradient) on every backend this board has, the softmax
# invariants, the DecoderBlock and Conv1D cases (decoder.mfg, conv1d.mfg beside attention.mfg:
# output and every gradient), and a checkpoint round trip on flash. One line per check: max
# error, PASS/FAIL.
import os

import microformer as mf
from microformer import checkpoint, golden

GOLDEN = ("golden/attention.mfg", "/golden/attention.mfg", "tests/golden/attention.mfg")
TOLERANCE = {"python": 1e-4, "viper": 5e-3, "native": 1e-4}   # relative to max(1, max |expected|)
LAYERS = (("decoder", "decoder.mfg", golden.check_decoder), ("conv1d", "conv1d.mfg", golden.check_conv1d))


def _find(path):
    for p in (path,) if path else GOLDEN:
        try:
            os.stat(p)
            return p
        except OSError:
            pass
    raise OSError("selftest: golden file not found (looked in %s); run `make selftest`"
                  % (path or ", ".join(GOLDEN)))


def _line(backend, name, err, tol):
    ok = err <= tol
    print("%-7s %-14s max err %.2e  (tol %.0e)  %s" % (backend, name, err, tol, "PASS" if ok else "FAIL"))
    return ok


def _checkpoint_roundtrip(path="selftest.mfck"):
    mf.seed(3)
    a = mf.Sequential([mf.Dense(4, 8), mf.Attention(8, 2)])
    checkpoint.save(path, a, meta={"selftest": 1})
    mf.seed(4)
    b = mf.Sequential([mf.Dense(4, 8), mf.Attention(8, 2)])
    meta = checkpoint.load(path, b)
    os.remove(path)
    same = meta.get("selftest") == 1
    for (_, p), (_, q) in zip(a.named_params(), b.named_params()):
        same = same and bytes(p.data) == bytes(q.data)
    print("%-7s %-14s %s  %s" % ("flash", "checkpoint", "bit-identical" if same else "DIFFERENT",
                                 "PASS" if same else "FAIL"))
    return same


def run(path=None):
    """Run every check; print one line each; return True when all pass."""
    path = _find(path)
    before = mf.get_backend()
    passed = failed = 0
    try:
        for backend in mf.available_backends():
            errors, problems = golden.check_attention(path, backend)
            tol = TOLERANCE[backend]
            for name in sorted(errors):
                if _line(backend, name, errors[name], tol):
                    passed += 1
                else:
                    failed += 1
            print("%-7s %-14s %s  %s" % (backend, "invariants", "; ".join(problems[:3]) or
                                          "rows sum to 1, hidden keys weigh 0", "FAIL" if problems else "PASS"))
            if problems:
                failed += 1
            else:
                passed += 1
            folder = path.rsplit("/", 1)[0] if "/" in path else "."
            for layer, name, check in LAYERS:
                lp = folder + "/" + name
                try:
                    os.stat(lp)
                except OSError:
                    print("%-7s %-14s %s missing (run `make selftest`)  FAIL" % (backend, layer, lp))
                    failed += 1
                    continue
                errors = check(lp, backend)
                worst = max(errors.values())
                which = [k for k in errors if errors[k] == worst][0]
                if _line(backend, layer + " " + which, worst, tol):
                    passed += 1
                else:
                    failed += 1
    finally:
        mf.set_backend(before)
    if _checkpoint_roundtrip():
        passed += 1
    else:
        failed += 1
    print("selftest: %d passed, %d failed" % (passed, failed))
    return failed == 0


if __name__ == "__main__":
    run()
