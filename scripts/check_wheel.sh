#!/usr/bin/env bash
# The release wheel's promise, checked on this machine: a wheel built with libjpeg-turbo linked
# in statically (STOKER_JPEG=static), repaired by auditwheel, installs into a fresh virtual
# environment and decodes through stoker's C extension on a system where libjpeg's headers and
# shared library are absent (hidden in a private mount namespace: bind-mounted empty files).
#
#   scripts/check_wheel.sh [LIBJPEG_TURBO_SOURCE]     (needs root for the namespace, cmake, nasm)
#
# What only a release CI proves: the other platforms of [tool.cibuildwheel] (aarch64, macOS,
# the manylinux_2_28 image itself) and the other CPython versions.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d /tmp/stoker-wheel-XXXXXX)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}

step() { printf '\n== %s\n' "$*"; }

step "static libjpeg-turbo with SIMD"
bash scripts/build_libjpeg_turbo.sh "$work/ljt" "${1:-}" | tail -1

step "a clean tree of the last commit (never a build/ folder left by an in-place build)"
mkdir "$work/src" && git archive HEAD | tar -x -C "$work/src"
git log -1 --format='%h %s' | cut -c1-100

step "wheel (STOKER_JPEG=static) and auditwheel repair"
STOKER_JPEG=static STOKER_JPEG_PREFIX="$work/ljt" "$python" -m pip wheel -q --no-deps \
    --no-build-isolation -w "$work/dist" "$work/src"
"$python" -m auditwheel repair -w "$work/wheelhouse" "$work"/dist/stoker-*.whl 2>&1 | tail -1
wheel=$(ls "$work"/wheelhouse/stoker-*.whl)
"$python" -m auditwheel show "$wheel" | tr -s ' \n' ' ' | fold -s -w 100; echo

step "what the extension needs and shows"
mkdir "$work/unpacked" && (cd "$work/unpacked" && "$python" -m zipfile -e "$wheel" .)
so=$(ls "$work"/unpacked/stoker/decode/_jpeg*.so)
needed=$(readelf -d "$so" | awk '/NEEDED/{print $NF}' | tr -d '[]' | tr '\n' ' ')
echo "NEEDED: $needed"
case "$needed" in *jpeg*) echo "FAIL: the extension still needs a shared libjpeg"; exit 1;; esac
exported=$(nm -D --defined-only "$so" | awk '{print $NF}' | grep -v '^_' | tr '\n' ' ')
echo "exported: $exported"
[ "$exported" = "PyInit__jpeg " ] || { echo "FAIL: symbols besides PyInit__jpeg are exported"; exit 1; }

step "fresh venv, libjpeg hidden"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q -c "$root/constraints.txt" "$wheel"
hide=""
for f in /usr/include/jpeglib.h /usr/include/x86_64-linux-gnu/jconfig.h \
         /usr/lib/x86_64-linux-gnu/libjpeg.so /usr/lib/x86_64-linux-gnu/libjpeg.so.62 \
         /usr/lib/x86_64-linux-gnu/libjpeg.a /usr/lib/aarch64-linux-gnu/libjpeg.so.62; do
    [ -e "$f" ] && hide="$hide mount --bind /dev/null $f &&"
done
cat > "$work/probe.py" <<'PY'
import ctypes, os, subprocess, sys, tempfile
import numpy as np
from PIL import Image
import stoker
from stoker.decode import jpegcrop
assert "site-packages" in stoker.__file__, stoker.__file__
try:
    ctypes.CDLL("libjpeg.so.62")
    sys.exit("the system's libjpeg.so.62 can still be loaded: the check proves nothing")
except OSError as exc:
    print(f"the system's libjpeg cannot be loaded here ({exc})")
assert jpegcrop.AVAILABLE, "the wheel's C extension did not load"
folder = tempfile.mkdtemp()
os.mkdir(f"{folder}/a")
rng = np.random.default_rng(0)
pixels = np.clip(rng.normal(128, 40, (96, 128, 3)), 0, 255).astype(np.uint8)
Image.fromarray(pixels).save(f"{folder}/a/x.jpg", quality=90)
with stoker.Loader(folder, batch_size=1, image_size=(96, 128), augment=None, workers=0) as ld:
    images, _ = next(iter(ld))
reference = np.asarray(Image.open(f"{folder}/a/x.jpg").convert("RGB"), np.int16)
diff = np.abs(images[0].astype(np.int16) - reference)
print(f"decoded {images.shape} through the wheel; max |difference| to Pillow: {diff.max()}")
assert diff.max() <= 2, "the wheel's decode differs from Pillow's"
doctor = subprocess.run([sys.executable, "-m", "stoker", "doctor"], capture_output=True, text=True)
line = [l for l in doctor.stdout.splitlines() if l.startswith("JPEG decoder in use")]
print(line[0] if line else doctor.stdout + doctor.stderr)
assert line and "C extension" in line[0], "stoker doctor does not name the C extension"
PY
unshare -m sh -c "$hide cd $work && $work/venv/bin/python probe.py"
echo "wheel check passed: $(basename "$wheel")"
