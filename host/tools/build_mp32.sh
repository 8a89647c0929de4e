#!/usr/bin/env bash
# host/tools/build_mp32.sh SRC OUT: an ESP32-like MicroPython on this machine. Builds OUT/micropython32-sp,
# the MicroPython unix port as a static 32-bit (i386) program with single-precision floats, so that
# viper `int` is a 32-bit word that wraps mod 2^32, floats are float32 and objects have a board's
# sizes (the stock unix port from requirements.txt is 64-bit with double-precision floats).
#
#   SRC  a MicroPython source tree, or a source tarball (.tar.gz / .tgz). Tested with v1.29.0-preview
#        commit 1c3c201149. Only py extmod shared ports/unix lib/{littlefs,oofatfs,re1.5,uzlib,
#        crypto-algorithms} are read; no git submodules, no mpy-cross. SRC is never modified: it is
#        extracted or copied to OUT/src and patched there.
#   OUT  output folder (the Makefile uses build/mp32): OUT/micropython32-sp, OUT/src, OUT/build-sp,
#        OUT/build-sp.log.
#
# Two source patches make Ctrl-C behave as on an ESP32 (each fails the build if its snippet is not
# found exactly once, e.g. in another MicroPython version):
#   1. ports/unix/variants/mpconfigvariant_common.h: MICROPY_ASYNC_KBD_INTR (!MICROPY_PY_THREAD_GIL)
#      -> (0). The stock unix port raises KeyboardInterrupt from inside the SIGINT handler (a
#      longjmp out of whatever the VM was doing); if that was the garbage collector or an allocation,
#      the heap stays locked ("MemoryError: heap is locked"). With 0 the handler schedules the
#      exception and the VM raises it at its next check, which is what the ESP32 port does.
#   2. ports/unix/unix_mphal.c: a second SIGINT while one is still pending calls exit(1) (kills
#      the process); an ESP32 just schedules the interrupt again. That branch is removed.
#
# Float maths use SSE2 (-mfpmath=sse), not the x87 default of -m32: each float32 operation is
# rounded once, as on x86-64 and the ESP32-S3 FPU. libm (exp, pow, ...) is glibc's, not the board's
# newlib: those can differ from a board in the last bit.
#
# Needs make, gcc, python3 and gcc-multilib (i386 libc for gcc -m32). When gcc -m32 -static does not
# work and the script runs as root with apt-get, it installs gcc-multilib (MP32_NO_APT=1 forbids
# that). Env: JOBS (default nproc), MICROPY_GIT_TAG (version string; default from
# SRC/py/mpconfig.h, so a source inside another git repository does not take that repository's
# commit as its version), SOURCE_DATE_EPOCH (build date baked in). About 15-30 s on 2 cores.
set -euo pipefail

SRC=${1:?usage: host/tools/build_mp32.sh MICROPYTHON_SRC OUT_DIR (SRC: a source tree or a .tar.gz)}
OUT=${2:?usage: host/tools/build_mp32.sh MICROPYTHON_SRC OUT_DIR (SRC: a source tree or a .tar.gz)}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
PARTS="py extmod shared ports/unix lib/littlefs lib/oofatfs lib/re1.5 lib/uzlib lib/crypto-algorithms"

test -e "$SRC" || { echo "build_mp32: MicroPython source $SRC does not exist" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TREE="$OUT/src"

# 1. a private, writable copy of the source
rm -rf "$TREE"
mkdir -p "$TREE"
case "$SRC" in
    *.tar.gz|*.tgz)
        echo "build_mp32: extracting $SRC into $TREE"
        tar -xzf "$SRC" -C "$TREE"
        # a tarball with one top-level folder (micropython-x.y/...) is used from inside it
        if [ ! -f "$TREE/ports/unix/Makefile" ]; then
            top=$(find "$TREE" -mindepth 2 -maxdepth 4 -path '*/ports/unix/Makefile' | head -1)
            [ -n "$top" ] && TREE=${top%/ports/unix/Makefile}
        fi ;;
    *)
        test -d "$SRC" || { echo "build_mp32: $SRC is neither a source tree nor a .tar.gz" >&2; exit 2; }
        echo "build_mp32: copying the unix port's sources from $SRC into $TREE"
        for p in $PARTS; do
            if [ -d "$SRC/$p" ]; then mkdir -p "$TREE/$(dirname "$p")"; cp -R "$SRC/$p" "$TREE/$p"; fi
        done ;;
esac
test -f "$TREE/ports/unix/Makefile" -a -f "$TREE/py/mpconfig.h" || {
    echo "build_mp32: $SRC is not a MicroPython source (no ports/unix/Makefile and py/mpconfig.h)" >&2; exit 2; }

# 2. the two Ctrl-C patches (see the header); each snippet must be found exactly once
python3 - "$TREE" <<'EOF'
import sys
tree = sys.argv[1]
PATCHES = [
    ("ports/unix/variants/mpconfigvariant_common.h",
     "#define MICROPY_ASYNC_KBD_INTR         (!MICROPY_PY_THREAD_GIL)",
     "#define MICROPY_ASYNC_KBD_INTR         (0)   /* ESP32-like: KeyboardInterrupt is scheduled */"),
    ("ports/unix/unix_mphal.c",
     "        if (MP_STATE_MAIN_THREAD(mp_pending_exception) == MP_OBJ_FROM_PTR(&MP_STATE_VM(mp_kbd_exception))) {\n"
     "            // this is the second time we are called, so die straight away\n"
     "            exit(1);\n"
     "        }\n",
     "        // ESP32-like: a second SIGINT while one is pending schedules it again (no exit(1))\n"),
]
for rel, old, new in PATCHES:
    path = tree + "/" + rel
    with open(path) as f:
        text = f.read()
    n = text.count(old)
    if n != 1:
        sys.exit("build_mp32: patch for %s: expected the snippet exactly once, found it %d times:\n%s"
                 % (rel, n, old))
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    print("build_mp32: patched %s" % rel)
EOF

# 3. a compiler that can build and statically link 32-bit x86 programs
can_m32() {
    local t; t=$(mktemp -d)
    printf '#include <stdio.h>\n#include <math.h>\nint main(void){printf("%%d\\n",(int)sizeof(void*));return (int)sqrt(0.0);}\n' > "$t/t.c"
    gcc -m32 -static -o "$t/t" "$t/t.c" -lm >/dev/null 2>&1 && [ "$("$t/t")" = 4 ]
    local rc=$?; rm -rf "$t"; return $rc
}
if ! can_m32; then
    if [ "${MP32_NO_APT:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "build_mp32: installing gcc-multilib (i386 libc for gcc -m32)"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-multilib >/dev/null
    fi
    can_m32 || { echo "build_mp32: gcc -m32 -static does not work; apt-get install gcc-multilib" >&2; exit 2; }
fi
for tool in make python3; do
    command -v $tool >/dev/null || { echo "build_mp32: $tool is missing" >&2; exit 2; }
done

# 4. the version string (see the header)
if [ -z "${MICROPY_GIT_TAG:-}" ]; then
    v() { awk -v k="$1" '$1=="#define" && $2==k {print $3; exit}' "$TREE/py/mpconfig.h"; }
    MICROPY_GIT_TAG="v$(v MICROPY_VERSION_MAJOR).$(v MICROPY_VERSION_MINOR).$(v MICROPY_VERSION_MICRO)"
    [ "$(v MICROPY_VERSION_PRERELEASE)" = 0 ] || MICROPY_GIT_TAG="$MICROPY_GIT_TAG-preview"
fi
export MICROPY_GIT_TAG
export MICROPY_GIT_HASH=${MICROPY_GIT_HASH:-mp32}

# 5. build: the 'standard' variant minus btree, ssl, ffi (they need submodules) and frozen modules
EXE="$OUT/micropython32-sp"
rm -f "$EXE" "$EXE.new"
echo "build_mp32: building micropython32-sp ($MICROPY_GIT_TAG) with $JOBS jobs (log: $OUT/build-sp.log)"
start=$(date +%s)
make -C "$TREE/ports/unix" -j"$JOBS" \
    VARIANT=standard BUILD="$OUT/build-sp" \
    MICROPY_PY_BTREE=0 MICROPY_PY_SSL=0 MICROPY_PY_FFI=0 FROZEN_MANIFEST= \
    CFLAGS_EXTRA="-m32 -msse2 -mfpmath=sse -DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT" \
    LDFLAGS_EXTRA="-m32 -static" \
    > "$OUT/build-sp.log" 2>&1 || { tail -40 "$OUT/build-sp.log" >&2; exit 1; }
cp "$OUT/build-sp/micropython" "$EXE.new"

# 6. check it before it takes the final name: 32-bit words, viper wraps mod 2^32, single floats,
#    and the patched Ctrl-C (a scheduled KeyboardInterrupt)
cat > "$OUT/check.py" <<'EOF'
import sys, micropython, array
@micropython.viper
def mul(a: int, b: int) -> int:
    return a * b
assert sys.maxsize == 2147483647, sys.maxsize
assert mul(100000, 100000) == 1410065408, mul(100000, 100000)   # 10**10 mod 2**32
assert array.array('f', [0.1])[0] == 0.1, "floats are not single precision"
print("ok maxsize=%d viper=%d float=single" % (sys.maxsize, mul(100000, 100000)))
EOF
if ! got=$("$EXE.new" "$OUT/check.py" 2>&1); then
    rm -f "$EXE.new" "$OUT/check.py"
    echo "build_mp32: micropython32-sp failed its check: $got" >&2; exit 1
fi
rm -f "$OUT/check.py"
grep -q "MICROPY_ASYNC_KBD_INTR         (0)" "$TREE/ports/unix/variants/mpconfigvariant_common.h" || {
    echo "build_mp32: the Ctrl-C patch is not in the built source" >&2; exit 1; }
mv "$EXE.new" "$EXE"
echo "build_mp32: $got"
echo "build_mp32: built in $(( $(date +%s) - start )) s: $EXE ($(stat -c %s "$EXE") bytes)"
