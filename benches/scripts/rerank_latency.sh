#!/usr/bin/env bash
# What the second stage costs a `scd compress` call: one multi-file code
# context of the agent set (about 10k e5 tokens, benches/data/agent/out/code.jsonl),
# its task, a budget of 1,000 tokens; the embeddings warm in a store
# (--embedding-cache) so the call's own work is what is timed; the stage on
# (--rerank-weight 1: model load and checks included, as a CLI call pays them)
# and off (--rerank-weight 0) in alternation, RUNS times each.
# Prints each call's wall time and the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
SCD=${SCD_BIN:-target/release/scd}
RUNS=${RUNS:-7}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import json, sys
cases = [json.loads(l) for l in open("benches/data/agent/out/code.jsonl")]
case = min(cases, key=lambda c: abs(c["context_tokens"] - 10000))
fields = [{"name": f["name"], "kind": "code", "content": f["content"]} for f in case["context"]["fields"]]
json.dump({"fields": fields}, open(f"{sys.argv[1]}/context.json", "w"))
open(f"{sys.argv[1]}/task.txt", "w").write(case["task"])
print(f"case {case['id']}: {case['context_tokens']} e5 tokens, {len(fields)} files", file=sys.stderr)
PY
call() {
  local t0 t1
  t0=$(date +%s.%N)
  "$SCD" compress --threads 2 --context "$work/context.json" --task "$(cat "$work/task.txt")" --budget 1000 \
    --embedding-cache "$work/emb.redb" --format text "$@" > /dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
call > /dev/null  # fills the embedding store
on=(); off=()
for _ in $(seq "$RUNS"); do
  on+=("$(call --rerank-weight 1)"); off+=("$(call --rerank-weight 0)")
done
printf 'on  (s): %s\noff (s): %s\n' "${on[*]}" "${off[*]}"
python3 -c "
import statistics as s, sys
on, off = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
print(f'median on {s.median(on):.3f} s, off {s.median(off):.3f} s, ratio {s.median(on) / s.median(off):.2f}')" "${on[*]}" "${off[*]}"
