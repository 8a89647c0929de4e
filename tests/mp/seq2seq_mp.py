# The seq2seq demo's greedy decoding of the first N held-out strings from a checkpoint, on one backend:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/seq2seq_mp.py model.mfck N backend out.json
import json
import sys

import microformer as mf
import seq2seq


def run(path, n, backend):
    model = mf.load_model(path)
    mf.set_backend(backend)
    r = seq2seq.evaluate(model, seq2seq.heldout()[:n], batch_size=10)
    return {"outputs": r["outputs"], "exact": r["exact"], "copy": r["copy"]}


if __name__ == "__main__":
    res = run(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    with open(sys.argv[4], "w") as f:
        json.dump(res, f)
