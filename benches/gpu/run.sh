#!/usr/bin/env bash
# The measuring call on the GPU machine (see benches/gpu/README.md). Run from
# the repository root after the transfer calls copied every part of the pack
# into .gpu-stage/. Writes $OUT/gpu_report.{json,svg}, $OUT/results/*.json and
# $OUT/gpu_run.log. Every step has its own time limit and a failing step does
# not stop the others: the report says what failed.
set -uo pipefail
OUT="${OUT:-$PWD/.gpu-out}"
mkdir -p "$OUT/results"
exec > >(tee -a "$OUT/gpu_run.log") 2>&1
T0=$(date +%s)
say() { echo "[gpu +$(( $(date +%s) - T0 ))s] $*"; }
R="$OUT/results"
W=/tmp/scd-gpu
STEP_S="${STEP_S:-150}"
# REHEARSE=1 runs the same steps on a CPU machine with a 24-text corpus
# (PY=... names a Python with numpy when none has torch)
DEVICE=cuda BTS="8192 16384 32768 65536" WARM=256
if [ -n "${REHEARSE:-}" ]; then DEVICE=cpu BTS="8192" WARM=4; fi

# --- Python with torch (its site-packages hold the CUDA 13 libraries) --------
PY="${PY:-}"
[ -n "$PY" ] || for p in python3 python /opt/conda/bin/python /usr/local/bin/python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch" 2>/dev/null; then PY="$p"; break; fi
done
if [ -z "$PY" ]; then say "no Python with torch found; the baseline will be missing"; PY=python3; fi
say "python: $PY ($($PY -c 'import sys; print(sys.version.split()[0])'))"

# --- the pack -------------------------------------------------------------------
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
say "pack ready in $W"

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
export SCD_ORT_LIB="$W/ort/libonnxruntime.so" SCD_MODELS_DIR="$W/models" SCD_DEVICE="$DEVICE"
SCD="$W/bin/scd"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
say "glibc $(ldd --version | head -1 | awk '{print $NF}'); missing libraries of the CUDA provider:"
ldd "$W/ort/libonnxruntime_providers_cuda.so" | grep "not found" || echo "  none"

failed() { # failed RC NAME: report a failed step (true) or nothing (false)
  [ "$1" -eq 0 ] && return 1
  [ "$1" -eq 124 ] && echo "timed out after ${STEP_S}s" >> "$R/$2.err"
  say "  FAILED ($1): $(tail -3 "$R/$2.err")"
}
step() { # step NAME COMMAND... : stdout JSON -> $R/NAME.json, errors kept
  local name="$1"; shift
  say "$name"
  timeout "$STEP_S" "$@" > "$R/$name.json" 2> "$R/$name.err"
  failed $? "$name"
}
embed() { # embed NAME ARGS... : scd embed-batch, summary JSON as the result
  local name="$1"; shift
  say "$name"
  timeout "$STEP_S" "$SCD" embed-batch --overwrite --summary-json "$R/$name.json" "$@" 2> "$R/$name.err"
  failed $? "$name" || tail -1 "$R/$name.err"
}

# --- weights generated here (2 GB never travel) ------------------------------------
for m in e5-large-arch-fp16 e5-large-arch; do
  step "materialize_$m" "$PY" benches/gpu/gpu_bench.py materialize "$W/models/$m"
done

# --- GPU vs CPU: e5-small fp16 on CUDA against fp32 on CPU ----------------------------
C="$W/check"
embed gpu_check_passage --model e5-small-fp16-check --input "$C/check.jsonl" --output /tmp/check_p.npy
embed gpu_check_query --model e5-small-fp16-check --query --input "$C/check.jsonl" --output /tmp/check_q.npy
embed gpu_check_passage_nobind --model e5-small-fp16-check --io-binding false --input "$C/check.jsonl" \
  --output /tmp/check_pn.npy
step cos_passage "$PY" benches/gpu/gpu_bench.py check /tmp/check_p.npy "$C/cpu_fp32_passage.npy"
step cos_query "$PY" benches/gpu/gpu_bench.py check /tmp/check_q.npy "$C/cpu_fp32_query.npy"
step cos_passage_nobind "$PY" benches/gpu/gpu_bench.py check /tmp/check_pn.npy "$C/cpu_fp32_passage.npy"

# --- throughput: E5-large architecture, mixed-length real text -----------------------
K="$W/corpus/corpus.jsonl"
if [ -n "${REHEARSE:-}" ]; then head -n 24 "$K" > /tmp/corpus24.jsonl; K=/tmp/corpus24.jsonl; fi
for bt in $BTS; do
  embed "scd_fp16_bt$bt" --model e5-large-arch-fp16 --batch-tokens "$bt" --warmup-texts "$WARM" \
    --input "$K" --output /tmp/large.npy
done
embed scd_fp16_bt16384_nobind --model e5-large-arch-fp16 --batch-tokens 16384 --io-binding false \
  --warmup-texts "$WARM" --input "$K" --output /tmp/large.npy
embed scd_fp32tf32_bt16384 --model e5-large-arch --batch-tokens 16384 --warmup-texts "$WARM" \
  --input "$K" --output /tmp/large32.npy

# --- PyTorch fp16 baseline on the same token ids ------------------------------------
step torch_sorted_bt16384 "$PY" benches/gpu/gpu_bench.py torch --corpus "$W/corpus" --mode sorted --batch-tokens 16384
step torch_sorted_bt65536 "$PY" benches/gpu/gpu_bench.py torch --corpus "$W/corpus" --mode sorted --batch-tokens 65536
step torch_naive_rows64 "$PY" benches/gpu/gpu_bench.py torch --corpus "$W/corpus" --mode naive --max-rows 64

cp "$W/corpus/stats.json" "$R/corpus_stats.json" 2>/dev/null || true
"$PY" benches/gpu/gpu_bench.py report "$R" "$OUT" > /dev/null
say "done; report in $OUT/gpu_report.json"
cat "$OUT/gpu_report.json" | head -c 6000
