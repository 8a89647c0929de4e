#!/usr/bin/env bash
# host/xtensa/build.sh SHARED OUT: MicroPython for QEMU's Xtensa `-M sim -cpu de233_fpu` machine,
# built from source (`make xtensa-port`). Writes OUT/firmware.elf (and OUT/toolchain, OUT/mp,
# OUT/obj, OUT/build.log).
#
#   SHARED  the folder with the third-party sources (../shared next to the project):
#           micropython/micropython-*-src.tar.gz and -extras.tar.gz (the same commit as the 32-bit
#           unix port; the extras hold lib/libm), xtensa/xtensa-dynconfig-*.tar.gz and
#           xtensa/xtensa-overlays-esp32s3-*.tar.gz (the ESP32-S3 core description).
#   OUT     output folder (the Makefile uses build/xtensa).
#
# Toolchain, all Debian packages: binutils-xtensa-lx106, picolibc-xtensa-lx106-elf and
# qemu-system-misc from this machine's release (installed with apt-get when missing and running as
# root; XTENSA_NO_APT=1 forbids that), and gcc-xtensa-lx106 13 from Debian 13 (trixie): Debian 12's
# GCC 12 ignores the core description when generating code (it would emit ESP8266 code: no FPU, and
# libgcc calls into Debian's call0-ABI libgcc). On Debian 12 the trixie compiler and the libraries
# it needs (libc6 2.38+ ...) are fetched by name with `apt-get download` through a private apt
# configuration in OUT/toolchain and unpacked there with dpkg -x; nothing is installed
# system-wide. On Debian 13 the system's gcc-xtensa-lx106 is used. About 60 MB of packages.
#
# The core description: the ESP32-S3 overlay with XCHAL_HAVE_MUL32_HIGH and XCHAL_HAVE_FP_RECIP
# turned off (QEMU's de233_fpu has neither mulsh/muluh nor recip0.s), built into the shared object
# that binutils and GCC load through XTENSA_GNU_CONFIG.
set -euo pipefail
SHARED=${1:?usage: host/xtensa/build.sh SHARED_DIR OUT_DIR}
OUT=${2:?usage: host/xtensa/build.sh SHARED_DIR OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
say() { echo "xtensa-port: $*"; }
die() { echo "xtensa-port: $*" >&2; exit 2; }

# 1. the third-party sources
pick() { local f; f=$(ls $1 2>/dev/null | head -1); [ -n "$f" ] || die "missing $1 (the sources next to the project: ../shared)"; echo "$f"; }
MP_SRC=$(pick "$SHARED/micropython/micropython-*-src.tar.gz")
MP_EXTRAS=$(pick "$SHARED/micropython/micropython-*-extras.tar.gz")
DYNCONFIG=$(pick "$SHARED/xtensa/xtensa-dynconfig-*.tar.gz")
OVERLAYS=$(pick "$SHARED/xtensa/xtensa-overlays-esp32s3-*.tar.gz")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TC="$OUT/toolchain"

# 2. Debian packages of this release
need_pkgs=()
command -v xtensa-lx106-elf-as >/dev/null || need_pkgs+=(binutils-xtensa-lx106)
[ -f /usr/lib/xtensa-lx106-elf/include/setjmp.h ] || need_pkgs+=(picolibc-xtensa-lx106-elf)
command -v qemu-system-xtensa >/dev/null || need_pkgs+=(qemu-system-misc)
. /etc/os-release 2>/dev/null || true
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
    command -v xtensa-lx106-elf-gcc >/dev/null && xtensa-lx106-elf-gcc -dumpversion | grep -q '^1[3-9]' \
        || need_pkgs+=(gcc-xtensa-lx106)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "${XTENSA_NO_APT:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing ${need_pkgs[*]} with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null; } \
            || die "apt-get install ${need_pkgs[*]} failed"
    else
        die "missing Debian packages: ${need_pkgs[*]} (apt-get install them, as root)"
    fi
fi

# 3. GCC 13 for xtensa-lx106-elf
if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    if [ ! -x "$TC/bin/xtensa-gcc" ]; then
        command -v apt-get >/dev/null || die "apt-get is needed to fetch gcc-xtensa-lx106 from Debian 13"
        say "fetching gcc-xtensa-lx106 13 and its libraries from Debian 13 (trixie) into $TC"
        rm -rf "$TC"; mkdir -p "$TC/apt/lists/partial" "$TC/apt/cache/archives/partial" "$TC/debs" "$TC/root" "$TC/bin" "$TC/as"
        echo "deb http://deb.debian.org/debian trixie main" > "$TC/apt/sources.list"
        APT=(-o Dir::Etc::SourceList="$TC/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o Dir::State::Lists="$TC/apt/lists" -o Dir::Cache="$TC/apt/cache" -o Debug::NoLocking=1
             -o APT::Sandbox::User=root)
        apt-get "${APT[@]}" update -q >/dev/null || die "apt-get update for trixie failed (network?)"
        (cd "$TC/debs" && apt-get "${APT[@]}" download gcc-xtensa-lx106/trixie libc6/trixie \
            libstdc++6/trixie libgcc-s1/trixie libgmp10/trixie libisl23/trixie libmpc3/trixie \
            libmpfr6/trixie zlib1g/trixie libzstd1/trixie >/dev/null) || die "apt-get download from trixie failed"
        for d in "$TC"/debs/*.deb; do dpkg -x "$d" "$TC/root"; done
        R="$TC/root"
        LDSO="$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        LIBS="$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu"
        G=$(ls -d "$R"/usr/lib/gcc/xtensa-lx106-elf/1*)
        for b in cc1 collect2 lto-wrapper; do
            mv "$G/$b" "$G/$b.real"
            printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$LDSO" "$LIBS" "$G/$b.real" > "$G/$b"
            chmod +x "$G/$b"
        done
        ln -sf "$(command -v xtensa-lx106-elf-as)" "$TC/as/as"
        GCC=$(ls "$R"/usr/bin/xtensa-lx106-elf-gcc-1*)
        printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" -B"%s/" "$@"\n' "$LDSO" "$LIBS" "$GCC" "$TC/as" > "$TC/bin/xtensa-gcc.new"
        chmod +x "$TC/bin/xtensa-gcc.new"
        mv "$TC/bin/xtensa-gcc.new" "$TC/bin/xtensa-gcc"
    fi
    XCC="$TC/bin/xtensa-gcc"
else
    XCC=$(command -v xtensa-lx106-elf-gcc)
fi

# 4. the core description: ESP32-S3 minus MUL32_HIGH and FP_RECIP
CORE=xtensa_esp32s3_qemu
if [ ! -f "$TC/$CORE.so" ]; then
    say "building the core description $CORE.so (ESP32-S3 without mulsh/muluh/recip0.s)"
    rm -rf "$TC/dynconfig" "$TC/conf"; mkdir -p "$TC/dynconfig" "$TC/conf"
    tar -xzf "$DYNCONFIG" -C "$TC/dynconfig" --strip-components=1
    tar -xzf "$OVERLAYS" -C "$TC/conf"
    mv "$TC/conf/xtensa-overlays/xtensa_esp32s3" "$TC/conf/$CORE" 2>/dev/null || mv "$TC/conf"/*/xtensa_esp32s3 "$TC/conf/$CORE"
    for f in "$TC/conf/$CORE"/*/include/xtensa-config.h; do
        sed -i -e 's/^\(#define XCHAL_HAVE_MUL32_HIGH\s*\)1/\10/' -e 's/^\(#define XCHAL_HAVE_FP_RECIP\s*\)1/\10/' "$f"
        [ "$(grep -cE '^#define XCHAL_HAVE_(MUL32_HIGH|FP_RECIP)\s+0' "$f")" = 2 ] || die "could not turn off MUL32_HIGH/FP_RECIP in $f"
    done
    f="$TC/conf/$CORE/newlib/newlib/libc/sys/xtensa/include/xtensa/config/core-isa.h"
    sed -i -e 's/^\(#define XCHAL_HAVE_MUL32_HIGH\s*\)1/\10/' -e 's/^\(#define XCHAL_HAVE_FP_RECIP\s*\)1/\10/' "$f"
    [ "$(grep -cE '^#define XCHAL_HAVE_(MUL32_HIGH|FP_RECIP)\s+0' "$f")" = 2 ] || die "could not turn off MUL32_HIGH/FP_RECIP in $f"
    (cd "$TC/conf" && sh "$TC/dynconfig/scripts/fix-known-overlay-issues.sh")
    make -s -C "$TC/dynconfig" CONF_DIR="$TC/conf" "$CORE.so" >/dev/null
    # the full ESP32-S3 description too, to disassemble code built for a board (mulsh, muluh, ...)
    tar -xzf "$OVERLAYS" -C "$TC/conf"
    mv "$TC/conf/xtensa-overlays/xtensa_esp32s3" "$TC/conf/xtensa_esp32s3" 2>/dev/null || mv "$TC/conf"/*/xtensa_esp32s3 "$TC/conf/xtensa_esp32s3"
    (cd "$TC/conf/xtensa_esp32s3" && sh "$TC/dynconfig/scripts/fix-known-overlay-issues.sh")
    make -s -C "$TC/dynconfig" CONF_DIR="$TC/conf" xtensa_esp32s3.so >/dev/null
    mv "$TC/dynconfig/xtensa_esp32s3.so" "$TC/xtensa_esp32s3.so"
    mv "$TC/dynconfig/$CORE.so" "$TC/$CORE.so"
fi
export XTENSA_GNU_CONFIG="$TC/$CORE.so"

# 5. the MicroPython source (with lib/libm from the extras)
if [ ! -f "$OUT/mp/.extracted" ] || [ ! -d "$OUT/mp/examples/natmod" ]; then
    rm -rf "$OUT/mp"; mkdir -p "$OUT/mp"
    say "extracting $(basename "$MP_SRC") and lib/libm, tools/, examples/natmod from $(basename "$MP_EXTRAS")"
    tar -xzf "$MP_SRC" -C "$OUT/mp"
    tar -xzf "$MP_EXTRAS" -C "$OUT/mp" lib/libm tools examples/natmod
    touch "$OUT/mp/.extracted"
fi
v() { awk -v k="$1" '$1=="#define" && $2==k {print $3; exit}' "$OUT/mp/py/mpconfig.h"; }
export MICROPY_GIT_TAG="v$(v MICROPY_VERSION_MAJOR).$(v MICROPY_VERSION_MINOR).$(v MICROPY_VERSION_MICRO)-preview"
export MICROPY_GIT_HASH=xtensa-qemu

# 6. build
say "building firmware.elf with $(basename "$XCC") $("$XCC" -dumpversion) (log: $OUT/build.log)"
start=$(date +%s)
make -C "$HERE" -j"$JOBS" TOP="$OUT/mp" BUILD="$OUT/obj" CC="$XCC" CROSS_COMPILE=xtensa-lx106-elf- \
    XTENSA_CORE_INC="$TC/conf/$CORE/newlib/newlib/libc/sys/xtensa/include" \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log" >&2; exit 1; }
cp "$OUT/obj/firmware.elf" "$OUT/firmware.elf.new"

# 7. checks: no libgcc helper left undefined (the link would fail), none calling itself (GCC turns
#    some idioms in helpers.c into calls to the helper being defined), no instruction the emulated
#    core lacks
if xtensa-lx106-elf-objdump -d "$OUT/firmware.elf.new" | grep -qE '\s(mulsh|muluh|recip0\.s)\s'; then
    die "firmware.elf uses mulsh/muluh/recip0.s, which QEMU's de233_fpu lacks"
fi
selfcall=$(xtensa-lx106-elf-objdump -d "$OUT/firmware.elf.new" | awk '
    /^[0-9a-f]+ <[^>]+>:$/ { f = $2; gsub(/[<>:]/, "", f); next }
    /call(x)?[0-9]+[ \t]+[0-9a-f]+ </ { t = $NF; gsub(/[<>]/, "", t); if (t == f && f ~ /^__/) print f }' | sort -u)
[ -z "$selfcall" ] || die "libgcc helpers calling themselves (infinite recursion): $selfcall"

mv "$OUT/firmware.elf.new" "$OUT/firmware.elf"

# 8. the instruction-counting QEMU plugin (host/xtensa/insn_plugin.c) for run.py --count-insns
gcc -shared -fPIC -O2 -Wall -o "$OUT/libinsn.so" "$HERE/insn_plugin.c" || die "building libinsn.so failed"
say "built in $(( $(date +%s) - start )) s: $OUT/firmware.elf"
