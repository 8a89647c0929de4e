# board/benchmarks/selftest.py on the emulated core (host/xtensa/xtest.py copies tests/golden/*.mfg to /golden)
import selftest

print("SELFTEST", selftest.run())
