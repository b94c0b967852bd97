#!/usr/bin/env bash
# The persistent embedding cache across processes: `scd compress` on an
# 18k-token context (real Rust source files from the code-search dev set)
# with an empty cache file, then the same call in new processes, which find
# every embedding in the file. Prints the times, the embedding counts each
# process reports and the cold/warm ratio; the texts must be identical.
#   benches/scripts/cache_warm.sh [RUNS]   (release binary; make build first)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/target/release/scd"
SHARED="${SCD_SHARED_DIR:-$ROOT/../shared}"
RUNS="${1:-3}"
export SCD_ORT_LIB="${SCD_ORT_LIB:-$ROOT/.tools/ort/libonnxruntime.so}" SCD_MODELS_DIR="${SCD_MODELS_DIR:-$ROOT/models/out}"
[ -x "$BIN" ] || { echo "no $BIN: run make build" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 - "$SHARED/evaldata/code/code_search_dev.jsonl" "$TMP/context.json" <<'PY'
import json, sys
fields, size = {}, 0
with open(sys.argv[1]) as f:
    for line in f:
        for fl in json.loads(line)["context"]["fields"]:
            # about 18k e5 tokens of source (~2.9 bytes a token)
            if fl["name"] not in fields and size + len(fl["content"]) <= 54000:
                fields[fl["name"]] = fl
                size += len(fl["content"])
json.dump({"fields": list(fields.values())}, open(sys.argv[2], "w"))
print(f"context: {len(fields)} files, {size} bytes", file=sys.stderr)
PY
TASK="Where is the hash state seeded from a fixed key?"
run() { # NAME -> seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" --embedding-cache "$TMP/embeddings.redb" compress --task "$TASK" --context "$TMP/context.json" \
    --budget 2000 --format text >"$TMP/$1.txt" 2>"$TMP/$1.err"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
cold=$(run cold)
grep -h -- "-- " "$TMP/cold.err"
printf 'cold (empty cache file):  %.2f s\n' "$cold"
warm_all=()
for i in $(seq 1 "$RUNS"); do
  w=$(run "warm$i")
  warm_all+=("$w")
  cmp -s "$TMP/cold.txt" "$TMP/warm$i.txt" || { echo "warm run $i printed another text" >&2; exit 1; }
  printf 'warm %d (new process):    %.2f s   %s\n' "$i" "$w" "$(grep -h -- '-- embeddings' "$TMP/warm$i.err")"
done
median=$(printf '%s\n' "${warm_all[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
printf 'median warm: %.2f s; cold / warm = %.1fx; cache file %s bytes\n' "$median" "$(echo "$cold / $median" | bc -l)" \
  "$(stat -c %s "$TMP/embeddings.redb")"
