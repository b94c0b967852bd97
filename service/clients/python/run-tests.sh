#!/usr/bin/env bash
# The Python client's tests against a real `scd serve` ($SCD_BIN, default
# target/debug/scd), in the venv service/tests/setup.sh makes. Extra
# arguments go to pytest. Under CI=true or SCD_REQUIRE_MODELS=1 (as `make
# test` sets) a missing binary, model or package fails instead of skipping.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$ROOT"
PY="$ROOT/.tools/py-client-venv/bin/python"
if [ ! -x "$PY" ]; then
  echo "no $PY: run service/tests/setup.sh first" >&2
  exit 2
fi
export SCD_MODELS_DIR="${SCD_MODELS_DIR:-$ROOT/models/out}"
export SCD_ORT_LIB="${SCD_ORT_LIB:-$ROOT/.tools/ort/libonnxruntime.so}"
exec "$PY" -m pytest service/clients/python/tests -q "$@"
