#!/usr/bin/env bash
# SCD on agent material (issue 45) beside the grep-like, BM25 and first-N
# baselines in the same `scd-dev eval --dataset agent` run, per kind, at 5x and
# 10x in cl100k. Sets: `shared` (the 42 cases of ../shared/evaldata/agent)
# `registry` (logs, docs, json and chat from registry packages, built by
# benches/data/agent/build_data.py into benches/data/agent/out) and `code`
# (benches/data/agent/code/build.py); `sweep` runs shared and registry
# together with SWEEP's settings chosen by FOLDS-fold cross-validation.
# `all` runs shared and registry (logs, docs, json, chat) in one run.
# Raw outputs: benches/results/eval_agent_<set>.{txt,json,svg} (NAME
# renames `all`'s). EMBEDDING_STORE=FILE keeps the embeddings across runs
# (`--embedding-store`); REV names the binary's commit in the header when
# it was built from another tree than this one's HEAD.
set -euo pipefail
cd "$(dirname "$0")/../.."
E=${SCD_SHARED_DIR:-../shared}/evaldata
SCD=${SCD_DEV_BIN:-target/release/scd-dev}
. benches/scripts/record.sh
run() {
  local set=$1; shift
  local out=benches/results/eval_agent_$set
  local cmd=("$SCD" --threads 2 eval --dataset agent "$@" --budgets 0.2,0.1 --budget-tokenizer cl100k
    --report "$out.json" --plot "$out.svg")
  [ -z "${EMBEDDING_STORE:-}" ] || cmd+=(--embedding-store "$EMBEDDING_STORE")
  record "$out" 24 "${cmd[@]}"
}
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(shared registry code)
for s in "${sets[@]}"; do
  case $s in
    shared) run shared --data "$E/agent/agent_dev.jsonl" ;;
    registry) O=benches/data/agent/out
      run registry --data "$O/logs.jsonl" --data "$O/docs.jsonl" --data "$O/json.jsonl" --data "$O/chat.jsonl" ;;
    all) O=benches/data/agent/out
      run "${NAME:-all}" --data "$E/agent/agent_dev.jsonl" --data "$O/logs.jsonl" --data "$O/docs.jsonl" \
        --data "$O/json.jsonl" --data "$O/chat.jsonl" --per-example "benches/results/eval_agent_${NAME:-all}_per_case.jsonl" ;;
    code) run code --data benches/data/agent/out/code.jsonl ;;
    # settings chosen by cross-validation over shared + registry: SWEEP is the
    # grid (`key=v1,v2 key2=...`), KINDS the kinds run, NAME the output's name
    sweep) O=benches/data/agent/out
      run "${NAME:-sweep}" --data "$E/agent/agent_dev.jsonl" --data "$O/logs.jsonl" --data "$O/docs.jsonl" \
        --data "$O/json.jsonl" --data "$O/chat.jsonl" --kinds "${KINDS:-logs,docs,json,chat}" \
        --sweep "${SWEEP:?SWEEP=\"key=v1,v2 ...\", the settings to cross-validate}" --folds "${FOLDS:-5}" ;;
    *) echo "unknown set $s (shared, registry, code, all, sweep)" >&2; exit 2 ;;
  esac
done
