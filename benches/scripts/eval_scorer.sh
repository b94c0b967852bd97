#!/usr/bin/env bash
# The learned scorer against the hand-weighted sum on the dev halves, in
# one `scd eval` per set (`scd` is the hand sum, `scd[ scorer=1]` the
# learned one; the baselines in the same run). Raw outputs:
# benches/results/eval_scorer_<set>.{txt,json,svg}.
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${SCD_SHARED_DIR:-../shared}/evaldata
SCD=${SCD_BIN:-target/release/scd}
run() {
  local set=$1; shift
  local out=benches/results/eval_scorer_$set
  local cmd=("$SCD" --threads 2 eval --dataset "$@" --sweep "scorer=1" --report "$out.json" --plot "$out.svg")
  {
    echo "# $(git rev-parse --short HEAD), release build, 2 cores; $(date -u +%FT%TZ)"
    echo "# command: ${cmd[*]}"
    "${cmd[@]}" 2>&1 | grep -v '^\s*$'
  } > "$out.txt"
  tail -n 20 "$out.txt"
}
run 2wiki 2wiki --path "$E/2wikimultihopqa/2wiki_sample.json" --budgets 0.25,0.33
run hotpotqa hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" --path "$E/hotpotqa/hotpot_hf_schema.jsonl" --limit 100 --budgets 0.25,0.33
run musique musique --path "$E/musique/musique_ans_sample.jsonl" --limit 100 --budgets 0.25,0.33
run squad squad --path "$E/squad_v2/squad_v2_dev_subset.json" --limit 200 --budgets 0.25
run code code --path "$E/code/code_search_dev.jsonl" --limit 350 --budgets 0.1,0.2
