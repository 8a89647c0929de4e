"""finetune.Session with LoRA (s.lora, s.save_adapter, Session(adapter=...), s.merge) on the Iris
checkpoint, under CPython and inside MicroPython on a board's heap (tests/mp/adapter_mp.py)."""
import helpers
import adapter_mp
from test_finetune import board_mpy, run_board_script


def test_session_lora_cpython(tmp_path, iris_flash, capsys):
    r = adapter_mp.run(iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b"))
    adapter_mp.check(r)
    out = capsys.readouterr().out
    # printed before the fine-tune: the adapted maps, trainable parameters, memory
    assert "lora: rank 4, alpha 8 on 4 linear maps: 3.q_proj, 3.k_proj" in out, out
    assert "trainable params %d of" % r["need"]["trainable"] in out, out
    assert "memory for a fine-tune batch of 16: %d bytes" % r["need"]["total_bytes"] in out, out


def test_session_lora_micropython(tmp_path, iris_flash, micropython):
    heap = helpers.board_heap(micropython)
    out = run_board_script(helpers.script("adapter_mp.py"),
                           [iris_flash(tmp_path / "a"), iris_flash(tmp_path / "b")], heap, micropython,
                           board_mpy(tmp_path / "mpy", micropython))
    assert "ADAPTER OK" in out, out
