#!/usr/bin/env bash
# Installs an aarch64 cake-train wheel and runs its self-test on this x86_64 machine, under
# qemu-aarch64 with Debian's arm64 Python (docs/build.md, "aarch64 wheels").
#
#   ci/aarch64_selftest.sh WHEEL
#
# The arm64 Python: Debian bookworm's python3 and pip wheel, downloaded and unpacked by
# debootstrap's first stage (no arm64 code runs to make it) into $CAKE_ARM64_ROOT (default
# build/arm64-debian; made once, about 230 MB), and run by qemu-aarch64-static with that folder
# as its library root (-L): no chroot, no binfmt_misc. Missing Debian tools (qemu-user-static,
# debootstrap) are installed with apt-get, which needs root.
#
# Then, with that Python: its own pip installs the wheel (--no-deps: the self-test without a GPU
# needs no torch) into a fresh folder, and `python -m cake selftest` checks every package's
# manifest and sources, and each prebuilt library's sha256 and embedded digest, loading each
# aarch64 library with the arm64 dynamic loader; check_manifests checks the installed packages.
set -euo pipefail
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
repo=$(cd "$(dirname "$0")/.." && pwd)
root="${CAKE_ARM64_ROOT:-$repo/build/arm64-debian}"
mirror="${CAKE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
say() { printf 'aarch64_selftest: %s\n' "$*"; }

missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v debootstrap >/dev/null || [ -x "$root/usr/bin/python3" ] || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$root/usr/bin/python3" ]; then
  say "unpacking Debian bookworm's arm64 python3 into $root"
  rm -rf "$root"
  # --foreign: download and unpack only; the packages' scripts (arm64 code) never run.
  debootstrap --foreign --arch=arm64 --variant=minbase --include=python3,python3-pip-whl \
    bookworm "$root" "$mirror" >/dev/null
  # The first stage unpacks the essential packages alone; unpack the rest it downloaded.
  for deb in "$root"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$root"; done
fi

python=(qemu-aarch64-static -L "$root" "$root/usr/bin/python3")
pip_wheel=$(ls "$root"/usr/share/python-wheels/pip-*.whl)
about=$("${python[@]}" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')
say "Python $about under $(qemu-aarch64-static --version | head -n 1)"

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "${python[@]}" "$pip_wheel/pip" install --quiet --no-deps --no-cache-dir --target "$site" "$wheel"
say "installed $(basename "$wheel") into $site"
# Outside the checkout, so that `cake` is the installed one.
cd "$site"
PYTHONPATH="$site" "${python[@]}" -m cake selftest
PYTHONPATH="$site" "${python[@]}" -m cake.checker "$site/cake"
say "ok"
