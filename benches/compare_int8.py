#!/usr/bin/env python3
"""int8 vs fp32 e5-small through SCD's own encoder, in one run.

Both models run as `scd-dev bench-encode` (release build) on the same texts with
the same threads, interleaved (fp32, int8, fp32, int8, ...) so that drift on a
shared machine hits both; each figure is the median of `--repeats` passes.
`--batch` is texts per encoder call: 1 is a task or a one-text Embed, 8 and
32 are typical Embed calls, 256 is a whole context as `compress` embeds it
(the encoder cuts every call into length-sorted batches of at most 512
padded tokens, the CPU default). Tokens/s count real (unpadded) tokens.

Inputs (from compare_encoders.py): HotpotQA paragraphs from ../shared/evaldata
("mixed" lengths) and their first 40 words ("uniform").

Usage: benches/compare_int8.py [--threads 2] [--texts 256] [--repeats 3]
Writes benches/results/compare_int8.json and prints the ratios.
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_encoders import EVAL, ROOT, inputs, scd  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32", default="e5-small")
    ap.add_argument("--int8", default="e5-small-int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 256])
    args = ap.parse_args()
    if not EVAL.exists():
        sys.exit(f"{EVAL} missing: the benchmark reads HotpotQA paragraphs from ../shared/evaldata")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts in inputs(args.texts).items():
            p = Path(tmp) / f"{name}.jsonl"
            p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            for b in args.batches:
                runs = {args.fp32: [], args.int8: []}
                for _ in range(args.repeats):
                    for model in runs:
                        runs[model].append(scd(model, p, b, args.threads))
                tps = {m: statistics.median(r["tokens_per_s"] for r in rs) for m, rs in runs.items()}
                row = {"inputs": name, "batch": b, "texts": len(texts), "tokens": runs[args.fp32][0]["tokens"],
                       "fp32_tokens_per_s": tps[args.fp32], "int8_tokens_per_s": tps[args.int8],
                       "ratio": tps[args.int8] / tps[args.fp32],
                       "passes": {m: [r["tokens_per_s"] for r in rs] for m, rs in runs.items()}}
                rows.append(row)
                print(f"{name:8} batch {b:3}: fp32 {row['fp32_tokens_per_s']:7.0f} tok/s  "
                      f"int8 {row['int8_tokens_per_s']:7.0f} tok/s  x{row['ratio']:.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"int8/fp32: min x{min(ratios):.2f}, geometric mean x{statistics.geometric_mean(ratios):.2f} "
          f"over {len(rows)} configurations ({args.threads} threads, median of {args.repeats})")
    out = ROOT / "benches" / "results"
    out.mkdir(exist_ok=True)
    report = {"threads": args.threads, "repeats": args.repeats, "fp32": args.fp32, "int8": args.int8, "rows": rows}
    (out / "compare_int8.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'compare_int8.json'}")


if __name__ == "__main__":
    main()
