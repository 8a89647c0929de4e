# The seed's C++ implementation (tiny_ai) on the Iris split board/demos/iris.py uses: 119/120 training
# and 28/30 held-out examples right. Imported by tests under CPython and inside MicroPython.
SEED_TRAIN = 119 / 120
SEED_TEST = 28 / 30
