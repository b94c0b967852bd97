#!/usr/bin/env bash
# The lexical excess lift (issue 45): the default (lexical_excess_weight 0.3
# from 4) against it off, with the baselines, on the 184 agent cases at 5x
# and 10x; the grid and its 5-fold cross-validation; the follow-up probes at
# both budgets; the Wikipedia dev halves and code search, off and from 3
# beside the default; the long-context set (each HotpotQA question's
# paragraphs among 90 of other questions), off beside the default; the
# MuSiQue follow-up loop with it and without.
# Raw outputs: benches/results/lexexcess45/<name>.{txt,json,svg} and the
# per-example files gzipped. STEPS="agent_grid ..." runs only the named
# steps. Embedding stores (caches of the texts' vectors, not results) go to
# $SCD_EMB_DIR (default target/emb).
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${SCD_SHARED_DIR:-../shared}/evaldata
SCD=${SCD_DEV_BIN:-target/release/scd-dev}
EMB=${SCD_EMB_DIR:-target/emb}
OUT=benches/results/lexexcess45
mkdir -p "$OUT" "$EMB"
. benches/scripts/record.sh
GRID="lexical_excess_weight=0,0.15,0.3,0.6 lexical_excess_from=2,3,4,6"
AGENT=(--dataset agent --data "$E/agent/agent_dev.jsonl")
for k in logs docs json chat code; do AGENT+=(--data "benches/data/agent/out/$k.jsonl"); done
AGENT+=(--budget-tokenizer cl100k --embedding-store "$EMB/agent.bin")
run() {
  local name=$1; shift
  [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $name "* ]] || return 0
  record "$OUT/$name" 3 "$SCD" --threads 2 eval "$@" --per-example "$OUT/$name.jsonl" --report "$OUT/$name.json" \
    --plot "$OUT/$name.svg"
  gzip -nf "$OUT/$name.jsonl"
}
run agent "${AGENT[@]}" --budgets 0.2,0.1 --sweep lexical_excess_weight=0
run agent_grid "${AGENT[@]}" --budgets 0.2,0.1 --scd-only --sweep "$GRID" --folds 5
if [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" agent_grid "* ]]; then
  CV=(python3 benches/scripts/agent_cv_grouped.py "$OUT/agent_grid.jsonl.gz"
    --baseline "scd[lexical_excess_weight=0 lexical_excess_from=2]")
  { echo "# command: ${CV[*]}"; "${CV[@]}"; } > "$OUT/agent_grid_cv_grouped.txt"
fi
run probe_5x "${AGENT[@]}" --adaptive --budgets 0.2 --sweep lexical_excess_weight=0
run probe_10x "${AGENT[@]}" --adaptive --budgets 0.1 --sweep lexical_excess_weight=0
WIKI="lexical_excess_weight=0,0.3 lexical_excess_from=3"
run 2wiki --dataset 2wiki --path "$E/2wikimultihopqa/2wiki_sample.json" --budgets 0.2,0.25,0.33 --scd-only \
  --sweep "$WIKI" --embedding-store "$EMB/2wiki.bin"
run hotpotqa --dataset hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" \
  --path "$E/hotpotqa/hotpot_hf_schema.jsonl" --budgets 0.2,0.25,0.33 --scd-only --sweep "$WIKI" \
  --embedding-store "$EMB/hotpotqa.bin"
run musique --dataset musique --path "$E/musique/musique_ans_sample.jsonl" --limit 100 --budgets 0.2,0.25,0.33 \
  --scd-only --sweep "$WIKI" --embedding-store "$EMB/musique.bin"
run squad --dataset squad --path "$E/squad_v2/squad_v2_dev_subset.json" --limit 200 --budgets 0.2,0.25,0.33 \
  --scd-only --sweep "$WIKI" --embedding-store "$EMB/squad.bin"
run code --dataset code --path "$E/code/code_search_dev.jsonl" --limit 350 --budgets 0.1,0.2,0.25,0.33,0.5 \
  --scd-only --sweep "$WIKI" --embedding-store "$EMB/code.bin"
run long --dataset hotpotqa --path "$E/hotpotqa/hotpot_original_schema.json" \
  --path "$E/hotpotqa/hotpot_hf_schema.jsonl" --limit 100 --among 100 --budgets 0.1,0.05,0.02 --scd-only \
  --sweep lexical_excess_weight=0 --embedding-store "$EMB/long.bin"
M=(--dataset musique --path "$E/musique/musique_ans_sample.jsonl" --adaptive --budgets 0.1,0.2,0.33 --hop-budget 0.1
  --embedding-store "$EMB/musique.bin")
run musique_loop "${M[@]}"
run musique_loop_off "${M[@]}" --sweep lexical_excess_weight=0
