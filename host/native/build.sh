#!/usr/bin/env bash
# host/native/build.sh MPSRC OUT ARCH...: build mf_native.c (this folder) as a MicroPython dynamic
# native module for each ARCH (x64, x86, xtensawin) into OUT/ARCH/mf_native.mpy, with MicroPython's
# own py/dynruntime.mk and tools/mpy_ld.py from MPSRC (a folder holding the source and extras
# tarballs of ../shared/micropython unpacked over each other). `make native` runs it.
#   x64        the system gcc; loads in the stock unix port (.venv/bin/micropython)
#   x86        the system gcc with -m32 -msse2 -mfpmath=sse; loads in build/mp32/micropython32-sp
#   x64-scalar x64 without the SSE code paths: the scalar sums, square root and division that
#              xtensawin runs, tested on the stock port (tests/mp/test_native.py)
#   xtensawin  GCC 13 for Xtensa with the ESP32-S3 core description (xtensa_toolchain.sh makes both
#              in OUT/xtensa-toolchain; or XTENSA_CROSS= and XTENSA_GNU_CONFIG= name your own),
#              -mabi=windowed: a build-only check here (host/native/README.md says what is checked)
# Each object file is checked before linking (check_elf.py: no initialised data, no libgcc or
# libm calls) and each .mpy after (its header: .mpy version 6, the architecture).
# Env: PYTHON (a Python with pyelftools and ar; default python3), XTENSA_GNU_CONFIG.
set -euo pipefail
MPSRC=${1:?usage: host/native/build.sh MPSRC OUT ARCH...}
OUT=${2:?usage: host/native/build.sh MPSRC OUT ARCH...}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
MPSRC=$(cd "$MPSRC" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
test -f "$MPSRC/py/dynruntime.mk" || { echo "native: $MPSRC/py/dynruntime.mk is missing (MicroPython's source)" >&2; exit 2; }
test -f "$MPSRC/tools/mpy_ld.py" || { echo "native: $MPSRC/tools/mpy_ld.py is missing (the extras tarball)" >&2; exit 2; }

# -O2 after dynruntime.mk's -Os; no fused multiply-add and no errno from sqrt, so the sums are the
# ones written in mf_native.c on every architecture
COMMON="-O2 -ffp-contract=off -fno-math-errno -fno-tree-loop-distribute-patterns"
for name in "$@"; do
    arch=${name%-scalar}                # x64-scalar: x64 built with the scalar code xtensawin runs
    work="$OUT/$name/obj"
    rm -rf "$work"
    mkdir -p "$work"
    cp "$HERE/mf_native.c" "$work/"
    cat > "$work/Makefile" <<EOF
MPY_DIR = $MPSRC
MOD = mf_native
SRC = mf_native.c
ARCH = $arch
include \$(MPY_DIR)/py/dynruntime.mk
EOF
    case "$arch" in
        x64) scalar=""
             if [ "$name" = x64-scalar ]; then scalar=-DMF_SCALAR; fi
             flags=(CROSS= "CFLAGS_EXTRA=$COMMON $scalar") ;;
        x86) flags=(CROSS= "CFLAGS_EXTRA=$COMMON -m32 -msse2 -mfpmath=sse") ;;
        xtensawin)
            if [ -z "${XTENSA_CROSS:-}" ]; then
                # GCC 13 and the ESP32-S3 core description in OUT/xtensa-toolchain (made once)
                "$HERE/xtensa_toolchain.sh" "$OUT/xtensa-toolchain"
                export XTENSA_CROSS="$OUT/xtensa-toolchain/bin/xtensa-lx106-elf-"
                export XTENSA_GNU_CONFIG="$OUT/xtensa-toolchain/xtensa_esp32s3.so"
            fi
            test -n "${XTENSA_GNU_CONFIG:-}" || { echo "native: xtensawin needs XTENSA_GNU_CONFIG (the ESP32-S3 core plugin)" >&2; exit 2; }
            cross=$XTENSA_CROSS
            specs=/usr/lib/xtensa-lx106-elf/picolibc.specs     # Debian's picolibc-xtensa-lx106-elf
            test -f "$specs" || { echo "native: $specs is missing (apt-get install picolibc-xtensa-lx106-elf)" >&2; exit 2; }
            flags=(CROSS="$cross" "CFLAGS_EXTRA=$COMMON -mabi=windowed -mlongcalls -specs=$specs") ;;
        *) echo "native: unknown ARCH $arch (x64, x86, xtensawin)" >&2; exit 2 ;;
    esac
    echo "native: building $arch"
    # the object first, checked, then the link (mpy_ld)
    make -s -C "$work" PYTHON="$PYTHON" "${flags[@]}" build-$arch/mf_native.o
    "$PYTHON" "$HERE/check_elf.py" "$work/build-$arch/mf_native.o"
    make -s -C "$work" PYTHON="$PYTHON" "${flags[@]}"
    cp "$work/mf_native.mpy" "$OUT/$name/mf_native.mpy"
    "$PYTHON" "$HERE/check_elf.py" --mpy "$arch" "$OUT/$name/mf_native.mpy"
    echo "native: $OUT/$name/mf_native.mpy ($(wc -c < "$OUT/$name/mf_native.mpy") bytes)"
done
