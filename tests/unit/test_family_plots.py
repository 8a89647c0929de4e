"""host/tools/plots.py: trains the demos briefly inside MicroPython and writes the four PNGs."""
import os
import subprocess
import sys

import helpers


def test_plots_write_pngs(tmp_path):
    out = tmp_path / "plots"
    proc = subprocess.run([sys.executable, os.path.join(helpers.TOOLS, "plots.py"), "--out", str(out),
                           "--epochs", "1", "--steps", "10"], capture_output=True, text=True, timeout=300,
                          cwd=helpers.ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("digits_training.png", "digits_attention.png", "charlm_training.png", "charlm_attention.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, name
