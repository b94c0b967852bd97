#!/usr/bin/env bash
# The default (the learned scorer, issue #27's second round) against the
# previous default in the same `scd-dev eval` run per set: `scd` is the
# default, `scd[scorer=0]` the hand-weighted sum; on code also the rare-name
# gate (`common_name_chunks`) and the sibling lift (`sibling_weight`), off
# and on, so `scd[scorer=0 common_name_chunks=0 sibling_weight=0]` is the
# previous default there. Baselines in the same run. Raw outputs:
# benches/results/eval_learned_<set>.{txt,json,svg}. Sets: arguments, or all.
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${SCD_SHARED_DIR:-../shared}/evaldata
SCD=${SCD_DEV_BIN:-target/release/scd-dev}
. benches/scripts/record.sh
run() {
  local set=$1; shift
  local out=benches/results/eval_learned_$set
  record "$out" 20 "$SCD" --threads 2 eval --dataset "$@" --report "$out.json" --plot "$out.svg"
}
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(musique 2wiki squad hotpotqa long code)
for s in "${sets[@]}"; do
  case $s in
    2wiki) run 2wiki 2wiki --path "$E/2wikimultihopqa/2wiki_sample.json" --budgets 0.25,0.33 --sweep scorer=0 ;;
    hotpotqa) run hotpotqa hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" --path "$E/hotpotqa/hotpot_hf_schema.jsonl" --limit 100 --budgets 0.25,0.33 --sweep scorer=0 ;;
    musique) run musique musique --path "$E/musique/musique_ans_sample.jsonl" --limit 100 --budgets 0.25,0.33 --sweep scorer=0 ;;
    squad) run squad squad --path "$E/squad_v2/squad_v2_dev_subset.json" --limit 200 --budgets 0.25 --sweep scorer=0 ;;
    long) run long hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" --path "$E/hotpotqa/hotpot_hf_schema.jsonl" --limit 100 --among 100 --budgets 0.1,0.05,0.02 --scd-only --sweep scorer=0 ;;
    code) run code code --path "$E/code/code_search_dev.jsonl" --limit 350 --budgets 0.1,0.2 --sweep "scorer=0,1 common_name_chunks=0,3 sibling_weight=0,1" ;;
    *) echo "unknown set $s" >&2; exit 2 ;;
  esac
done
