#!/usr/bin/env bash
# Build a static, position-independent libjpeg-turbo with its SIMD code under PREFIX, for
# `STOKER_JPEG=static` wheels (setup.py). Needs cmake, a C compiler and, on x86_64, nasm.
#
#   scripts/build_libjpeg_turbo.sh PREFIX [SOURCE]
#
# SOURCE is a libjpeg-turbo source tarball or folder; without it the pinned release tarball is
# downloaded and its sha256 checked. A SIMD build that cannot find its assembler fails here
# rather than giving a slow wheel.
set -euo pipefail
prefix=${1:?usage: build_libjpeg_turbo.sh PREFIX [SOURCE]}
mkdir -p "$prefix" && prefix=$(cd "$prefix" && pwd)
source=${2:-}
version=2.1.5
url="https://deb.debian.org/debian/pool/main/libj/libjpeg-turbo/libjpeg-turbo_${version}.orig.tar.gz"
sha256=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$source" ]; then
    source="$work/libjpeg-turbo.tar.gz"
    curl -fsSL "$url" -o "$source" || python3 -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" "$url" "$source"
    echo "$sha256  $source" | sha256sum -c - >/dev/null || shasum -a 256 -c <<<"$sha256  $source"
fi
if [ -d "$source" ]; then
    src=$source
else
    mkdir "$work/src"
    tar -xzf "$source" -C "$work/src" --strip-components=1
    src=$work/src
fi
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_SIMD=ON -DREQUIRE_SIMD=ON \
    -DWITH_TURBOJPEG=OFF -DWITH_JAVA=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_LIBDIR="$prefix/lib" -DCMAKE_C_FLAGS="-fvisibility=hidden"
cmake --build "$work/build" --parallel "$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
cmake --install "$work/build" >/dev/null
echo "libjpeg-turbo $version (static, SIMD) in $prefix"
