"""The sensor demo's pieces: the converted BasicMotions files, the .ts converter, a short host
training run (held-out accuracy far above chance), and the saved checkpoint giving the same
predictions under CPython and inside MicroPython (both interpreters, portable and viper kernels),
where board/demos/sensor.py also fine-tunes it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import microformer as mf
from microformer.data import read_csv

import sensor  # noqa: E402
import ts_to_csv  # noqa: E402

HOST_SENSOR = os.path.join(helpers.TOOLS, "train_sensor.py")
DATA = os.path.join(helpers.ROOT, "datasets")


def test_dataset_files():
    for name in (sensor.TRAIN, sensor.TEST):
        d = read_csv(os.path.join(DATA, name), sensor.CLASSES)
        assert d.X.shape == (40, 600), (name, d.X.shape)
        assert [d.y.count(k) for k in range(4)] == [10, 10, 10, 10], name
        x = np.asarray(d.X.data).reshape(40, 100, 6)
        assert np.isfinite(x).all() and x.std(axis=(0, 1)).min() > 0.1     # six live channels


def test_ts_converter_is_time_major(tmp_path):
    ts = tmp_path / "tiny.ts"
    ts.write_text("# two series, 2 dimensions x 3 steps\n@problemName tiny\n@classLabel true a b\n@data\n"
                  "1,2,3:10,20,30:a\n4.5,5,6:40,50,60.25:b\n")
    out = tmp_path / "tiny.csv"
    ts_to_csv.main([str(ts), str(out)])
    lines = out.read_text().splitlines()
    assert lines[0] == "t0_d0,t0_d1,t1_d0,t1_d1,t2_d0,t2_d1,label"
    assert lines[1:] == ["1,10,2,20,3,30,a", "4.5,40,5,50,6,60.25,b"]
    d = read_csv(str(out))
    assert mf.Tensor((2, 6), d.X.data).reshape(2, 3, 2).tolist()[1][2] == [6.0, 60.25]   # [B, L, C]
    with pytest.raises(SystemExit, match="exists"):                     # no silent overwrite
        ts_to_csv.main([str(ts), str(out)])
    bad = tmp_path / "bad.ts"
    bad.write_text("@classLabel true a\n@data\n1,2:3:a\n")
    with pytest.raises(ValueError, match="unequal length"):
        ts_to_csv.read_ts(str(bad))
    bad.write_text("@classLabel true a\n@data\n1,2:3,4:z\n")
    with pytest.raises(ValueError, match="label 'z' not among"):
        ts_to_csv.read_ts(str(bad))


def test_board_module_rejects_wrong_width(tmp_path):
    (tmp_path / sensor.TRAIN).write_text("a,b,label\n1,2,Standing\n")
    with pytest.raises(ValueError, match="has 2 values per row, expected 600"):
        sensor.load(sensor.TRAIN, str(tmp_path))
    with pytest.raises(ValueError, match="need 6 values, got 2 and 6"):
        sensor.standardize(sensor.load(sensor.TEST), [0.0, 0.0], [1.0] * 6)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A short host training run (12 epochs, CPython, NumPy backend) and its checkpoint."""
    out = tmp_path_factory.mktemp("sensor") / "sensor.mfck"
    r = subprocess.run([sys.executable, HOST_SENSOR, "--epochs", "12", "--quiet", "--out", str(out)],
                       cwd=helpers.ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return str(out)


def _host_predictions(ck):
    mf.set_backend("python")
    try:
        model, meta = mf.load_model(ck, with_meta=True)
        test = sensor.standardize(sensor.load(sensor.TEST, DATA), meta["mean"], meta["std"])
        preds = sensor.predictions(model, test)
        return preds, test.y, meta
    finally:
        mf.set_backend("numpy")


def test_host_training_beats_chance(checkpoint):
    preds, truth, meta = _host_predictions(checkpoint)
    acc = sum(p == t for p, t in zip(preds, truth)) / len(truth)
    assert len(preds) == len(truth) == 40
    assert acc >= 0.75, "held-out accuracy %.3f after 12 epochs (chance: 0.25)" % acc
    assert abs(acc - meta["host_test_acc"]) < 1e-9          # the checkpoint is the trained model
    assert mf.spec.same_architecture(meta["spec"], mf.to_spec(sensor.build_model()))


MP_SCRIPT = r'''
import json, sys
import microformer as mf
sys.path.append(sys.argv[3])
import sensor
mf.set_backend(sys.argv[2])
model, meta = mf.load_model(sys.argv[1], with_meta=True)
test = sensor.standardize(sensor.load(sensor.TEST, sys.argv[4]), meta["mean"], meta["std"])
preds = sensor.predictions(model, test)
r = sensor.main(sys.argv[1], epochs=1, data_dir=sys.argv[4], verbose=False)
print(json.dumps({"preds": preds, "before": r["test_acc_before"], "after": r["test_acc"],
                  "epochs": len(r["history"]), "s_per_epoch": r["s_per_epoch"]}))
'''


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_same_predictions_in_micropython_and_fine_tune(tmp_path, micropython, checkpoint, backend):
    want, truth, meta = _host_predictions(checkpoint)
    script = tmp_path / "sensor_mp.py"
    script.write_text(MP_SCRIPT)
    out = helpers.run_micropython(str(script), checkpoint, backend, helpers.DEMOS, DATA,
                                  heap="24M", exe=micropython)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["preds"] == want, "MicroPython (%s) predicts %s, CPython %s" % (backend, got["preds"], want)
    assert abs(got["before"] - meta["host_test_acc"]) < 1e-9
    assert got["epochs"] == 1 and got["after"] >= 0.75


def test_on_the_virtual_board(tmp_path, checkpoint, deployed_flash):
    """make deploy's path: the checkpoint (as /model.mfck) and both CSVs copied to the (virtual) board's
    flash over mpremote, then board/demos/sensor.py reads /data/ there, evaluates and fine-tunes one epoch."""
    import board_link
    import deploy
    import vboard
    _, _, meta = _host_predictions(checkpoint)
    board = vboard.VirtualBoard(tmp_path / "vb", heap="4M")
    deployed_flash(tmp_path / "vb", board.micropython)   # deployed before: the checkpoint and data change
    with board as b:
        deploy.deploy(str(b.port), checkpoint, data=(sensor.TRAIN, sensor.TEST))
        assert (b.flash / "data" / sensor.TEST).exists()
        out = board_link.mpremote(str(b.port), "exec", "import sensor\nsensor.main('model.mfck', epochs=1)",
                                  timeout=600)
        # and the REPL session opens it by default: windows of 100 x 6, the training file as base
        ses = board_link.mpremote(str(b.port), "exec", "import finetune\ns = finetune.Session(batch_size=8)\n"
                                  "s.freeze('attention')\ns.evaluate('train')", timeout=600)
    want = "held-out accuracy %.1f%% (40 series)" % (100 * meta["host_test_acc"])
    assert "checkpoint model.mfck: " + want in out, out
    assert "after 1 fine-tuning epochs" in out, out
    assert "input a window of 100 readings x 6 channels (acc_x, acc_y, acc_z, gyro_x, gyro_y, gyro_z); " \
           "base 40 rows" in ses, ses
    assert "freeze 4 parameters (1088 params): 5.self_attn.in_proj_weight 48x16" in ses, ses
    assert "accuracy %.1f%% (%d/40) on train" % (100 * meta["host_train_acc"], round(40 * meta["host_train_acc"])) \
        in ses, ses


def test_session_on_the_sensor_checkpoint(tmp_path, checkpoint):
    """host/tools/train_sensor.py writes what finetune.Session needs: the session scores the training
    file as the host did, predicts as board/demos/sensor.py does, and names the model's parts."""
    import shutil
    import finetune
    _, _, meta = _host_predictions(checkpoint)
    os.makedirs(str(tmp_path / "data"))
    shutil.copy(checkpoint, str(tmp_path / "model.mfck"))
    shutil.copy(os.path.join(DATA, sensor.TRAIN), str(tmp_path / "data" / sensor.TRAIN))
    mf.set_backend("python")
    try:
        s = finetune.Session(root=str(tmp_path), batch_size=8, verbose=False, backend="python")
        assert s.input_shape == [100, 6] and s.features == ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"]
        assert abs(s.evaluate("train", verbose=False).accuracy - meta["host_train_acc"]) < 1e-9
        train = sensor.standardize(sensor.load(sensor.TRAIN, DATA), meta["mean"], meta["std"])
        want = sensor.predictions(s.model, train)
        raw = sensor.load(sensor.TRAIN, DATA)
        for i in (0, 13, 39):
            row = raw.row(i)
            window = [row[t * 6:(t + 1) * 6] for t in range(100)]
            assert s.predict(window, False).label == sensor.CLASSES[want[i]]
        assert s.freeze("attention") == ["5.self_attn.in_proj_weight", "5.self_attn.in_proj_bias",
                                         "5.self_attn.out_proj.weight", "5.self_attn.out_proj.bias"]
        assert s.freeze("head") == ["7.weight", "7.bias"]
        assert s.fit(epochs=1, data="train", verbose=False).steps == 5
    finally:
        mf.set_backend("numpy")
