#!/usr/bin/env bash
# scd-dev eval on the five dev sets with e5-small (fp32) and, in the same run,
# e5-small-int8 (`--also-model`): raw outputs, reports and plots under
# benches/results/eval_int8_<set>.{txt,json,svg}; then the recall difference
# at every budget (benches/scripts/int8_recall_diff.py).
# Usage: benches/scripts/eval_int8.sh   (after `make build`; reads ../shared/evaldata)
set -euo pipefail
cd "$(dirname "$0")/../.."
S="${SCD_SHARED_DIR:-../shared}/evaldata"
R=benches/results
export SCD_ORT_LIB="${SCD_ORT_LIB:-$PWD/.tools/ort/libonnxruntime.so}" SCD_MODELS_DIR="${SCD_MODELS_DIR:-$PWD/models/out}"
run() {
  local set=$1; shift
  local cmd=(./target/release/scd-dev --threads 2 eval --also-model e5-small-int8 "$@"
             --report "$R/eval_int8_$set.json" --plot "$R/eval_int8_$set.svg")
  {
    echo "# release build of $(git rev-parse --short HEAD), 2 cores; $(date -u +%FT%TZ)"
    echo "# command: ${cmd[*]}"
    "${cmd[@]}"
  } 2>&1 | grep -v '^\s*$' > "$R/eval_int8_$set.txt"
  tail -n +3 "$R/eval_int8_$set.txt" | grep -E '^(scd|method)' || true
}
run squad --dataset squad --path "$S/squad_v2/squad_v2_dev_subset.json" --limit 200
run 2wiki --dataset 2wiki --path "$S/2wikimultihopqa/2wiki_sample.json" --limit 100
run musique --dataset musique --path "$S/musique/musique_ans_sample.jsonl" --limit 100
run hotpotqa --dataset hotpotqa --path "$S/hotpotqa/hotpot_original_schema.json" --path "$S/hotpotqa/hotpot_hf_schema.jsonl" --limit 100
run code --dataset code --path "$S/code/code_search_dev.jsonl" --limit 350 --budgets 0.1,0.2
python3 benches/scripts/int8_recall_diff.py "$R"/eval_int8_{squad,2wiki,musique,hotpotqa,code}.json | tee "$R/eval_int8_summary.txt"
