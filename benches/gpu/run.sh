#!/usr/bin/env bash
# The measuring call on the GPU machine (see benches/gpu/README.md for the
# plan and its time budget). Run from the repository root after the transfer
# calls copied every part of the pack into .gpu-stage/. Writes
# $OUT/gpu_report.{json,svg}, $OUT/results/* and $OUT/gpu_run.log. Every step
# has its own time limit and a failing step does not stop the others.
#
# REHEARSE=1 runs the same steps here, on the CPU, without a pack: the debug
# (or SCD=...) binary, e5-small-fp16 and its optimizer variants in the
# "large" role, also in the "small" one, 40 texts in blocks of 10, MIN_S=2 s.
# ONLY=REGEX runs only the steps whose name matches (a partial rerun).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$PWD/.gpu-out}"
mkdir -p "$OUT/results"
exec > >(tee -a "$OUT/gpu_run.log") 2>&1
T0=$(date +%s)
say() { echo "[gpu +$(( $(date +%s) - T0 ))s] $*"; }
R="$OUT/results"
STEP_S="${STEP_S:-75}"
ONLY="${ONLY:-.}"

if [ -n "${REHEARSE:-}" ]; then
  W="${W:-/tmp/scd-gpu-rehearsal}"
  DEVICE=cpu MIN_S="${MIN_S:-2}" WARM=8 BTS_LARGE="512 2048" BTS_SMALL="512 2048" BT_MAIN=512 BLOCK=10
  LARGE=e5-small-fp16 SMALL=e5-small-fp16 CHECK=e5-small-fp16
  PY="${PY:-$ROOT/.tools/venv/bin/python}"
  SCD="${SCD:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/scd}"
  say "CPU REHEARSAL (not a measurement): $SCD, stage in $W"
  if [ ! -f "$W/.staged" ]; then
    rm -rf "$W" && mkdir -p "$W/models"
    for m in e5-small e5-small-fp16; do  # files linked, folders real: the variants are written beside them
      mkdir -p "$W/models/$m" && ln -s "$ROOT/models/out/$m/"* "$W/models/$m/"
    done
    "$PY" benches/gpu/prep.py --rehearse --out "$W" --tokens 1 || exit 3
    head -n 40 "$W/corpus/corpus.jsonl" > "$W/corpus/head.jsonl" && mv "$W/corpus/head.jsonl" "$W/corpus/corpus.jsonl"
    "$PY" models/optimize_gpu.py "$W/models/e5-small-fp16" --heads 12 --hidden 384 \
      --standard "$W/models/e5-small" --report "$W/optimizer/e5-small-fp16.json" > /dev/null || exit 3
    touch "$W/.staged"
  fi
  export SCD_ORT_LIB="${SCD_ORT_LIB:-$ROOT/.tools/ort/libonnxruntime.so}"
else
  W=/tmp/scd-gpu
  DEVICE=cuda MIN_S="${MIN_S:-20}" WARM=256 BLOCK=2048 BTS_LARGE="8192 16384 32768 65536" BTS_SMALL="16384 65536"
  BT_MAIN=16384 LARGE=e5-large-arch-fp16 SMALL=e5-small-fp16-check CHECK=e5-small-fp16-check
  PY="${PY:-}"  # a Python with torch: its site-packages hold the CUDA 13 libraries
  [ -n "$PY" ] || for p in python3 python /opt/conda/bin/python /usr/local/bin/python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch" 2>/dev/null; then PY="$p"; break; fi
  done
  [ -n "$PY" ] || { say "no Python with torch found; the baseline will be missing"; PY=python3; }
  if [ ! -f "$W/.extracted" ]; then
    cat .gpu-stage/pack.tar.xz.* > /tmp/scd-pack.tar.xz
    want="$(cat .gpu-stage/SHA256 2>/dev/null || cat .gpu/parts/SHA256)"
    got="$(sha256sum /tmp/scd-pack.tar.xz | cut -d' ' -f1)"
    if [ "$want" != "$got" ]; then say "pack sha256 $got, expected $want: a part is missing"; ls -l .gpu-stage; exit 3; fi
    mkdir -p "$W"
    "$PY" -c "import tarfile; tarfile.open('/tmp/scd-pack.tar.xz', 'r:xz').extractall('$W')" || exit 3
    rm -f /tmp/scd-pack.tar.xz
    touch "$W/.extracted"
  fi
  NV="$("$PY" - <<'EOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = []
for r in roots:
    dirs += glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "lib64"))
    dirs += glob.glob(os.path.join(r, "torch", "lib"))
print(":".join(sorted(set(dirs))))
EOF
)"
  export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export SCD_ORT_LIB="$W/ort/libonnxruntime.so"
  SCD="$W/bin/scd"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  ldd "$W/ort/libonnxruntime_providers_cuda.so" | grep "not found" || say "CUDA provider: no missing library"
fi
export SCD_MODELS_DIR="$W/models" SCD_DEVICE="$DEVICE" RUST_BACKTRACE=0
say "python $PY; pack/stage ready in $W"
"$PY" - "$R/plan.json" <<EOF
import json, sys
json.dump({"rehearsal": bool("${REHEARSE:-}"), "device": "$DEVICE", "min_seconds": $MIN_S, "warmup_texts": $WARM,
           "large": "$LARGE", "small": "$SMALL", "check": "$CHECK", "batch_tokens_large": "$BTS_LARGE",
           "batch_tokens_small": "$BTS_SMALL", "step_s": $STEP_S}, open(sys.argv[1], "w"), indent=1)
EOF
cp "$W"/optimizer/*.json "$R/" 2>/dev/null && for f in "$R"/e5-*.json; do mv "$f" "$R/optimizer_$(basename "$f")"; done

SMI=""; command -v nvidia-smi >/dev/null 2>&1 && SMI=1
failed() { # failed RC NAME: report a failed step (true) or nothing (false)
  [ "$1" -eq 0 ] && return 1
  [ "$1" -eq 124 ] && echo "timed out after ${STEP_S}s" >> "$R/$2.err"
  say "  FAILED ($1): $(tail -3 "$R/$2.err")"
}
step() { # step NAME COMMAND... : stdout JSON -> $R/NAME.json, errors kept
  local name="$1"; shift
  [[ "$name" =~ $ONLY ]] || return 0
  say "$name"
  sample_start "$name"
  timeout "$STEP_S" "$@" > "$R/$name.json" 2> "$R/$name.err"
  local rc=$?
  sample_stop
  failed $rc "$name"
}
embed() { # embed NAME ARGS... : scd embed-batch, its summary JSON as the result
  local name="$1"; shift
  [[ "$name" =~ $ONLY ]] || return 0
  say "$name"
  sample_start "$name"
  timeout "$STEP_S" "$SCD" embed-batch --overwrite --summary-json "$R/$name.json" "$@" 2> "$R/$name.err"
  local rc=$?
  sample_stop
  failed $rc "$name" || tail -2 "$R/$name.err"
}
SAMPLER=""
sample_start() { # the GPU's busy share (NVML's utilization.gpu) every 100 ms during a step
  [ -n "$SMI" ] || return 0
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 100 > "$R/$1.gpu.csv" &
  SAMPLER=$!
}
sample_stop() { [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; SAMPLER=""; }

# --- weights generated there (0.67 GB never travels); the variants share them ---------
if [ -z "${REHEARSE:-}" ]; then
  step materialize "$PY" benches/gpu/gpu_bench.py materialize "$W/models/$LARGE"
  for v in packed keylen; do ln -f "$W/models/$LARGE/model.onnx.data" "$W/models/$LARGE-$v/model.onnx.data"; done
fi

# --- parity: fp16 on the device (plain, packed, key lengths) against fp32 on the CPU ----
C="$W/check"
for v in "" -packed -keylen; do
  n="${v#-}"; n="${n:-fused}"
  embed "check_passage_$n" --model "$CHECK$v" --input "$C/check.jsonl" --output "/tmp/check_p_$n.npy"
  step "cos_passage_$n" "$PY" benches/gpu/gpu_bench.py check "/tmp/check_p_$n.npy" "$C/cpu_fp32_passage.npy"
done
embed check_query_fused --model "$CHECK" --query --input "$C/check.jsonl" --output /tmp/check_q.npy
step cos_query_fused "$PY" benches/gpu/gpu_bench.py check /tmp/check_q.npy "$C/cpu_fp32_query.npy"

# --- throughput: every run lasts >= MIN_S seconds of steady state ----------------------
K="$W/corpus/corpus.jsonl"
RUN=(--input "$K" --warmup-texts "$WARM" --min-seconds "$MIN_S" --block-texts "$BLOCK")
for bt in $BTS_LARGE; do
  embed "scd_large_fused_bt$bt" --model "$LARGE" --batch-tokens "$bt" "${RUN[@]}" --output /tmp/large.npy
done
embed "scd_large_fused_bt${BT_MAIN}_serial" --model "$LARGE" --batch-tokens "$BT_MAIN" --overlap false \
  "${RUN[@]}" --output /tmp/large.npy
embed "scd_large_fused_bt${BT_MAIN}_workers2" --model "$LARGE" --batch-tokens "$BT_MAIN" --workers 2 \
  "${RUN[@]}" --output /tmp/large.npy
embed "scd_large_fused_bt${BT_MAIN}_splitcopies" --model "$LARGE" --batch-tokens "$BT_MAIN" --split-copies \
  "${RUN[@]}" --output /tmp/large.npy
for bt in $BT_MAIN ${BTS_LARGE##* }; do
  embed "scd_large_packed_bt$bt" --model "$LARGE-packed" --batch-tokens "$bt" "${RUN[@]}" --output /tmp/large.npy
done
embed "scd_large_keylen_bt$BT_MAIN" --model "$LARGE-keylen" --batch-tokens "$BT_MAIN" "${RUN[@]}" --output /tmp/large.npy
for bt in $BTS_SMALL; do
  embed "scd_small_fused_bt$bt" --model "$SMALL" --batch-tokens "$bt" "${RUN[@]}" --output /tmp/small.npy
done
embed "scd_small_packed_bt${BTS_SMALL##* }" --model "$SMALL-packed" --batch-tokens "${BTS_SMALL##* }" "${RUN[@]}" \
  --output /tmp/small.npy

# --- PyTorch fp16 on the same token ids (its best plan of the first run: sorted, 64k) ------
TB="${BTS_LARGE##* }"
step "torch_large_sorted_bt$TB" "$PY" benches/gpu/gpu_bench.py torch --corpus "$W/corpus" --arch large --mode sorted \
  --batch-tokens "$TB" --min-seconds "$MIN_S"
step "torch_small_sorted_bt$TB" "$PY" benches/gpu/gpu_bench.py torch --corpus "$W/corpus" --arch small --mode sorted \
  --batch-tokens "$TB" --min-seconds "$MIN_S"

cp "$W/corpus/stats.json" "$R/corpus_stats.json" 2>/dev/null || true
"$PY" benches/gpu/gpu_bench.py report "$R" "$OUT" > "$OUT/gpu_summary.json"
say "done; report in $OUT/gpu_report.json"
head -c 4000 "$OUT/gpu_summary.json"
