#!/usr/bin/env bash
# Retrain the reranker from scratch: the pinned training venv (.tools/train-venv,
# JAX's CPU wheels), the training groups (build_pairs.py -> .tools/rerank-data),
# the training run (train.py -> models/rerank/weights.safetensors, weights.sha256,
# reference.json, train_report.json) and the ONNX graph (build_onnx.py ->
# models/out/rerank). About 45 minutes on 2 cores. Not part of the default
# set-up, which builds the graph from the committed weights.
# Usage: models/rerank/train.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
models/setup.sh minilm  # the wheels, the main venv and libonnxruntime
VENV=.tools/train-venv
REQ="models/rerank/requirements.txt"
HASH="$(sha256sum "$REQ" | cut -c1-16)"
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$HASH" ]; then
  "${SCD_PYTHON:-python3.11}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
  echo "$HASH" > "$VENV/.requirements"
fi
cargo fetch  # the crates of Cargo.lock, unpacked: the code pairs' source
REGISTRY="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/index.crates.io-* | head -1)"
"$VENV/bin/python" models/rerank/build_pairs.py --registry "$REGISTRY" --out .tools/rerank-data
cp .tools/rerank-data/summary.json models/rerank/data_summary.json  # the sources, committed
COMMITTED="$(cut -d' ' -f1 models/rerank/weights.sha256 2>/dev/null || true)"
"$VENV/bin/python" models/rerank/train.py --data .tools/rerank-data --wheels .tools/wheels --out models/rerank
.tools/venv/bin/python models/rerank/build_onnx.py --wheels .tools/wheels --out models/out/rerank --force
NOW="$(sha256sum models/rerank/weights.safetensors | cut -d' ' -f1)"
if [ "$NOW" = "$COMMITTED" ]; then echo "weights: $NOW, the same as the committed ones"
else echo "weights: $NOW, not the committed ${COMMITTED:-(none)}: see git diff models/rerank"; fi
