#!/usr/bin/env bash
# The second stage (issue #45, item 2) on the development sets it was not
# trained or tuned on, with it off (the default, rows `scd`) and on
# (`scd[rerank_weight=1]`) in the same `scd-dev eval` run (the raw outputs
# of 0cc1acf, when it was on by default, swept rerank_weight=0 instead), the baselines beside them: the agent material
# (../shared/evaldata/agent and benches/data/agent/out, 5x and 10x in cl100k),
# HotpotQA, MuSiQue, 2Wiki and code search. Raw outputs:
# benches/results/eval_rerank45_<set>.{txt,json,svg}. EMBEDDING_STORE=FILE
# keeps the embeddings across runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${SCD_SHARED_DIR:-../shared}/evaldata
O=benches/data/agent/out
SCD=${SCD_DEV_BIN:-target/release/scd-dev}
. benches/scripts/record.sh
run() {
  local set=$1; shift
  local out=benches/results/eval_rerank45_$set
  local cmd=("$SCD" --threads 2 eval "$@" --sweep rerank_weight=1 --report "$out.json" --plot "$out.svg")
  [ -z "${EMBEDDING_STORE:-}" ] || cmd+=(--embedding-store "$EMBEDDING_STORE")
  record "$out" 4 "${cmd[@]}"
}
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(agent hotpotqa musique 2wiki code)
for s in "${sets[@]}"; do
  case $s in
    agent) run agent --dataset agent --data "$E/agent/agent_dev.jsonl" --data "$O/logs.jsonl" --data "$O/docs.jsonl" \
      --data "$O/json.jsonl" --data "$O/chat.jsonl" --data "$O/code.jsonl" --budgets 0.2,0.1 --budget-tokenizer cl100k \
      --per-example benches/results/eval_rerank45_agent_per_case.jsonl ;;
    hotpotqa) run hotpotqa --dataset hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" --limit 200 ;;
    musique) run musique --dataset musique --path "$E/musique/musique_ans_sample.jsonl" --limit 100 ;;
    2wiki) run 2wiki --dataset 2wiki --path "$E/2wikimultihopqa/2wiki_sample.json" --limit 100 ;;
    code) run code --dataset code --path "$E/code/code_search_dev.jsonl" --limit 350 --budgets 0.1,0.2 ;;
    *) echo "unknown set $s" >&2; exit 2 ;;
  esac
done
