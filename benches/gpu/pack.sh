#!/usr/bin/env bash
# Builds what the GPU machine needs into .gpu/parts/ (see benches/gpu/README.md):
#   pack.tar.xz.NN   parts of at most $PART_MB MB (each travels in one device call)
#   SHA256           sha256 of the whole pack.tar.xz
# The pack holds: the `scd` binary built with --features cuda (stripped), the
# three libraries of the pinned onnxruntime-gpu wheel, the check model and
# references, the E5-large skeletons and the corpus (benches/gpu/prep.py).
# Idempotent; run from anywhere. Needs models/setup.sh's venv and models.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
ORT_GPU_VERSION=1.31.1
PART_MB="${PART_MB:-55}"
PY=.tools/venv/bin/python
say() { printf '[gpu-pack] %s\n' "$*" >&2; }

models/setup.sh e5-small e5-small-fp16
rm -rf .gpu
STAGE=.gpu/stage
mkdir -p "$STAGE/bin" "$STAGE/ort" .gpu/parts

say "check model, references, E5-large skeletons, corpus"
"$PY" benches/gpu/prep.py --out "$STAGE"

say "scd with --features cuda"
cargo build --release -p scd-service --features cuda
objcopy --strip-all target/release/scd "$STAGE/bin/scd"

WHEELS=.tools/gpu
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/onnxruntime_gpu-"$ORT_GPU_VERSION"-*.whl >/dev/null 2>&1; then
  say "downloading onnxruntime-gpu==$ORT_GPU_VERSION from PyPI (256 MB)"
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$WHEELS" "onnxruntime-gpu==$ORT_GPU_VERSION"
fi
"$PY" - "$WHEELS" "$STAGE/ort" "$ORT_GPU_VERSION" <<'EOF'
import glob, sys, zipfile
wheels, dst, ver = sys.argv[1:]
z = zipfile.ZipFile(glob.glob(f"{wheels}/onnxruntime_gpu-{ver}-*.whl")[0])
for name in [f"libonnxruntime.so.{ver}", "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so"]:
    with open(f"{dst}/{name}", "wb") as f:
        f.write(z.read(f"onnxruntime/capi/{name}"))
EOF
ln -sfn "libonnxruntime.so.$ORT_GPU_VERSION" "$STAGE/ort/libonnxruntime.so"

say "compressing ($(du -sh "$STAGE" | cut -f1) staged)"
tar -C "$STAGE" -cf - . | xz -T0 -9 > .gpu/pack.tar.xz
sha256sum .gpu/pack.tar.xz | cut -d' ' -f1 > .gpu/parts/SHA256
split -b "${PART_MB}M" -d -a 2 .gpu/pack.tar.xz .gpu/parts/pack.tar.xz.
rm .gpu/pack.tar.xz
say "parts:"
ls -l .gpu/parts >&2
n=$(ls .gpu/parts/pack.tar.xz.* | wc -l)
say "$n transfer calls, then: bash benches/gpu/run.sh (see benches/gpu/README.md)"
