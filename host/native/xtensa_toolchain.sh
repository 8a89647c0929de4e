#!/usr/bin/env bash
# host/native/xtensa_toolchain.sh OUT: a C compiler that targets the ESP32-S3's core with its FPU, for
# `make native` (ARCH xtensawin), in OUT, touching nothing system-wide:
#   OUT/xtensa_esp32s3.so          the ESP32-S3 core description for binutils and GCC 13, built from
#                                  ../shared/xtensa (xtensa-dynconfig and espressif's overlay);
#                                  XTENSA_GNU_CONFIG points at it
#   OUT/bin/xtensa-lx106-elf-gcc   Debian trixie's GCC 13 for Xtensa (bookworm's GCC 12 ignores the
#                                  core description and emits soft-float library calls, which a
#                                  natmod cannot link), fetched by package name with apt-get
#                                  download into OUT/debs (a private apt configuration), unpacked
#                                  with dpkg -x and run through trixie's own ld.so and libraries;
#                                  it assembles with bookworm's binutils-xtensa-lx106
# Needs: apt-get, dpkg, cc, make; binutils-xtensa-lx106 and picolibc-xtensa-lx106-elf (installed with
# apt-get when missing and running as root). On Debian 13 the packaged compiler could be used as it is.
set -euo pipefail
OUT=${1:?usage: host/native/xtensa_toolchain.sh OUT}
SHARED=${SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -x "$OUT/bin/xtensa-lx106-elf-gcc" ] && [ -f "$OUT/xtensa_esp32s3.so" ]; then
    exit 0
fi
DYN=$(ls "$SHARED"/xtensa/xtensa-dynconfig-*.tar.gz 2>/dev/null | head -1)
OVL=$(ls "$SHARED"/xtensa/xtensa-overlays-esp32s3-*.tar.gz 2>/dev/null | head -1)
test -n "$DYN" -a -n "$OVL" || { echo "xtensa_toolchain: needs $SHARED/xtensa/xtensa-dynconfig-*.tar.gz and xtensa-overlays-esp32s3-*.tar.gz" >&2; exit 2; }
if ! command -v xtensa-lx106-elf-as >/dev/null || [ ! -f /usr/lib/xtensa-lx106-elf/picolibc.specs ]; then
    [ "$(id -u)" = 0 ] || { echo "xtensa_toolchain: apt-get install binutils-xtensa-lx106 picolibc-xtensa-lx106-elf (as root)" >&2; exit 2; }
    apt-get install -y -q binutils-xtensa-lx106 picolibc-xtensa-lx106-elf >/dev/null
fi

# 1. the core description
rm -rf "$OUT/dyn"
mkdir -p "$OUT/dyn"
tar -xzf "$DYN" -C "$OUT/dyn"
tar -xzf "$OVL" -C "$OUT/dyn"
make -s -C "$OUT/dyn/xtensa-dynconfig" CONF_DIR="$OUT/dyn/xtensa-overlays" xtensa_esp32s3.so
cp "$OUT/dyn/xtensa-dynconfig/xtensa_esp32s3.so" "$OUT/xtensa_esp32s3.so"

# 2. trixie's GCC 13 and the libraries it runs on, by package name
APT="$OUT/apt"
rm -rf "$APT" "$OUT/debs" "$OUT/root"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$OUT/debs" "$OUT/root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$APT/sources.list"
opts=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache")
apt-get "${opts[@]}" -q update >/dev/null
(cd "$OUT/debs" && apt-get "${opts[@]}" -q download gcc-xtensa-lx106 libc6 libstdc++6 libgcc-s1 libzstd1 \
    libisl23 libmpc3 libmpfr6 libgmp10 zlib1g >/dev/null 2>&1)
for d in "$OUT"/debs/*.deb; do
    dpkg -x "$d" "$OUT/root"
done
LIB="$OUT/root/usr/lib/x86_64-linux-gnu"
CC1=$(ls "$OUT"/root/usr/lib/gcc/xtensa-lx106-elf/*/cc1)
mv "$CC1" "$CC1.real"
printf '#!/bin/sh\nexec %s/ld-linux-x86-64.so.2 --library-path %s %s.real "$@"\n' "$LIB" "$LIB" "$CC1" > "$CC1"
chmod +x "$CC1"
mkdir -p "$OUT/bin"
printf '#!/bin/sh\nexec %s/ld-linux-x86-64.so.2 --library-path %s %s/root/usr/bin/xtensa-lx106-elf-gcc -B/usr/bin/xtensa-lx106-elf- "$@"\n' \
    "$LIB" "$LIB" "$OUT" > "$OUT/bin/xtensa-lx106-elf-gcc"
chmod +x "$OUT/bin/xtensa-lx106-elf-gcc"
"$OUT/bin/xtensa-lx106-elf-gcc" --version | head -1
