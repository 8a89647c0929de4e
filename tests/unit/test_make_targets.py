"""Make targets that must refuse clearly, and the files every target relies on."""
import subprocess
import sys

import helpers


def _make(*args):
    return helpers.make("-s", *args)


def test_flash_refuses_without_port():
    r = _make("flash", "PORT=", "FIRMWARE=fw.bin")
    assert r.returncode != 0
    assert "make flash needs PORT=" in r.stdout + r.stderr


def test_flash_refuses_without_firmware():
    r = _make("flash", "PORT=/dev/ttyACM0", "FIRMWARE=")
    assert r.returncode != 0
    assert "make flash needs FIRMWARE=" in r.stdout + r.stderr
    r = _make("flash", "PORT=/dev/ttyACM0", "FIRMWARE=/nonexistent/fw.bin")
    assert r.returncode != 0 and "not found" in r.stdout + r.stderr


def test_deploy_refuses_unknown_data():
    r = subprocess.run([sys.executable, "host/tools/deploy.py", "--port", "/nonexistent", "--data", "nope.csv"],
                       cwd=helpers.ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "DATA nope.csv: no such file (tried nope.csv and " in r.stderr, r.stderr
    assert "datasets/ has: basicmotions_test.csv, basicmotions_train.csv, digits.csv, iris.csv)" in r.stderr


def test_every_board_and_lib_file_compiles_for_the_esp32_s3():
    r = _make("compile-check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all files compile for xtensawin" in r.stdout
