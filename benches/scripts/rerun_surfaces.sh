#!/usr/bin/env bash
# The figures that depend on the serving path, for two `scd` builds in one
# run (issue 41: the application core must leave them unchanged within
# noise): the MCP window (every text block of 30 MCP results counted by
# tiktoken's cl100k), REST vs gRPC load (`scd-dev bench-load --protocol
# both`) and one replica vs two behind HAProxy (`scd-dev bench-replicas`).
# The same scd-dev drives both servers (`SCD_BIN`); the two builds take
# turns, so drift on the shared machine falls on both.
#
#   benches/scripts/rerun_surfaces.sh BEFORE_SCD AFTER_SCD [NAME]
#
# BEFORE_SCD / AFTER_SCD: release `scd` binaries; SCD_DEV_BIN: the driver
# (target/release/scd-dev); LOAD_SECONDS (45), REPLICA_SECONDS (30) and
# SESSIONS (300) as in BENCHMARKS.md. Raw outputs: benches/results/surfaces_NAME_*
# (bench-load's report is its stdout, the .json; its progress the .txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${1:?before scd}
AFTER=${2:?after scd}
NAME=${3:-41}
DEV=${SCD_DEV_BIN:-target/release/scd-dev}
E=${SCD_SHARED_DIR:-../shared}/evaldata
PY=.tools/venv/bin/python
export SCD_ORT_LIB=${SCD_ORT_LIB:-$PWD/.tools/ort/libonnxruntime.so}
export SCD_MODELS_DIR=${SCD_MODELS_DIR:-$PWD/models/out}
OUT=benches/results/surfaces_$NAME
CL100K=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/tiktoken-rs-0.12.1/assets/cl100k_base.tiktoken | head -1)
# the load tests' input: the first 192 HotpotQA dev paragraphs as "title. text"
MIXED=$(mktemp)
trap 'rm -f "$MIXED"' EXIT
$PY - "$E/hotpotqa/hotpot_hf_schema.jsonl" "$MIXED" <<'EOF'
import json, sys
out, n = open(sys.argv[2], "w"), 0
for line in open(sys.argv[1]):
    ex = json.loads(line)
    for title, sents in zip(ex["context"]["title"], ex["context"]["sentences"]):
        out.write(json.dumps({"text": f"{title}. {''.join(sents)}"}) + "\n")
        n += 1
        if n == 192:
            sys.exit(0)
EOF
stamp() { echo "# $1: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"; }
for which in before after; do
  bin=$BEFORE; [ $which = after ] && bin=$AFTER
  {
    stamp "mcp window, $which ($bin)"
    $PY service/tests/py/mcp_client.py window fixtures/agent_context.json "$CL100K" \
      "$E/hotpotqa/hotpot_hf_schema.jsonl" "$E/code/code_search_dev.jsonl" -- "$bin" mcp
  } > "${OUT}_mcp_window_$which.txt" 2>&1
  tail -1 "${OUT}_mcp_window_$which.txt"
done
for which in before after; do
  bin=$BEFORE; [ $which = after ] && bin=$AFTER
  stamp "bench-load, $which ($bin)" > "${OUT}_load_$which.txt"
  SCD_BIN=$bin $DEV --threads 2 bench-load --input "$MIXED" --clients 32 --seconds "${LOAD_SECONDS:-45}" --protocol both \
    > "${OUT}_load_$which.json" 2>> "${OUT}_load_$which.txt"
  tail -4 "${OUT}_load_$which.txt"
done
for which in before after; do
  bin=$BEFORE; [ $which = after ] && bin=$AFTER
  stamp "bench-replicas, $which ($bin)" > "${OUT}_replicas_$which.txt"
  SCD_BIN=$bin $DEV bench-replicas --seconds "${REPLICA_SECONDS:-30}" --latency-sessions "${SESSIONS:-300}" \
    --json "${OUT}_replicas_$which.json" >> "${OUT}_replicas_$which.txt" 2>&1
  tail -3 "${OUT}_replicas_$which.txt"
done
