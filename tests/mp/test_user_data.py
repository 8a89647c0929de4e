"""User examples per model: tests/mp/user_data_mp.py (two models on one board, each with its own
examples; a file that does not fit the model names the model it belongs to and is never offered
for deletion), under CPython and both MicroPython ports."""
import helpers
import user_data_mp


def test_user_data_per_model_cpython(tmp_path):
    user_data_mp.check(user_data_mp.run(str(tmp_path)))


def test_user_data_per_model_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("user_data_mp.py"), str(tmp_path), heap="1M", exe=micropython)
    assert "USER DATA OK" in out, out


def test_default_names():
    from mf_examples import user_data_for
    assert user_data_for("model.mfck") == "data/user.csv"
    assert user_data_for("room.mfck") == "data/room.user.csv"
    assert user_data_for("/sd/models/gesture.mfck") == "data/gesture.user.csv"
    assert user_data_for("model.mfck.bak") == "data/user.csv"          # a deploy's backup copy
    assert user_data_for("room.mfck.bak2") == "data/room.user.csv"
