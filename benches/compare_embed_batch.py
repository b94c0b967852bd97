#!/usr/bin/env python3
"""Same-run comparison of corpus embedding paths on this machine.

Runs, on the same JSONL corpus and model, alternating the order per round:
  embed        `scd embed --jsonl` (tokenize then run, per call of --chunk texts)
  batch        `scd embed-batch` (reader thread tokenizes block k+1 while block k runs; IoBinding)
  batch-plain  `scd embed-batch --io-binding false` (host pooling of last_hidden_state)
and prints tokens/s per path and the ratios to `embed`, plus a JSON line.

Usage: compare_embed_batch.py --input corpus.jsonl [--model e5-small] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCD = ROOT / "target/release/scd"


def run(cmd: list[str]) -> tuple[float, int]:
    env = dict(os.environ, SCD_ORT_LIB=str(ROOT / ".tools/ort/libonnxruntime.so"),
               SCD_MODELS_DIR=str(ROOT / "models/out"))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    wall = time.time() - t0
    m = re.search(r"(\d+) tokens in ([\d.]+)s", p.stderr)
    tokens, secs = int(m.group(1)), float(m.group(2))
    return tokens / secs, tokens, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--model", default="e5-small")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    base = [str(SCD), "--model", args.model]
    paths = {
        "embed": base + ["embed", "--jsonl", "--windows", "--input", str(args.input)],
        "batch": base + ["embed-batch", "--windows", "--overwrite", "--input", str(args.input),
                         "--output", str(tmp / "a.npy")],
        "batch-plain": base + ["--io-binding", "false", "embed-batch", "--windows", "--overwrite", "--input",
                               str(args.input), "--output", str(tmp / "b.npy")],
    }
    got: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(args.rounds):
        order = list(paths) if r % 2 == 0 else list(reversed(paths))
        for k in order:
            tps, tokens, _ = run(paths[k])
            got[k].append(tps)
            print(f"round {r + 1} {k:<12} {tps:8.0f} tokens/s ({tokens} tokens)", flush=True)
    best = {k: max(v) for k, v in got.items()}
    for k in paths:
        print(f"{k:<12} best {best[k]:8.0f} tokens/s  x{best[k] / best['embed']:.2f} vs embed")
    print(json.dumps({"model": args.model, "input": str(args.input), "tokens_per_s": got,
                      "ratio_vs_embed": {k: best[k] / best["embed"] for k in paths}}))


if __name__ == "__main__":
    main()
