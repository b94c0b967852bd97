#!/usr/bin/env python3
"""Which MatMuls of e5-small stay fp32 in ``e5-small-int8``: a greedy sensitivity sweep.

Dynamic int8 quantizes each MatMul's input with one scale per tensor, so a
projection whose input has outlier channels loses the rest of its range. The
issue names the suspects (the attention-output and FFN-output projections);
this sweep quantizes every MatMul per channel and, one candidate at a time,
keeps a suspect in fp32, scoring the worst cosine to the fp32 model on
calibration texts from the HotpotQA *train* sample (never the parity or
held-out seed texts that the tests check). Greedy: the best exclusion is kept
and the sweep repeats until the worst cosine reaches ``--target``.

The result is written into ``models/convert.py`` by hand (``INT8_FP32_MATMULS``);
the raw output is ``benches/results/int8_sensitivity.txt``.

Usage: .tools/venv/bin/python models/int8_sweep.py [--texts 160] [--target 0.995]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convert  # noqa: E402


def calibration(n: int) -> list[tuple[str, str]]:
    shared = Path(os.environ.get("SCD_SHARED_DIR") or HERE.parent.parent / "shared")
    data = json.loads((shared / "evaldata" / "hotpotqa" / "hotpot_train_sample.json").read_text())
    out: list[tuple[str, str]] = []
    for ex in data:
        out.append(("query: ", ex["question"]))
        for title, sents in ex["context"][:2]:
            out.append(("passage: ", title + ". " + "".join(sents)))
        if len(out) >= n:
            break
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=HERE / "out")
    ap.add_argument("--texts", type=int, default=160)
    ap.add_argument("--target", type=float, default=0.995)
    args = ap.parse_args()
    fp32 = args.models / "e5-small" / "model.onnx"
    tok = Tokenizer.from_file(str(args.models / "e5-small" / "tokenizer.json"))
    tok.no_truncation()
    texts = calibration(args.texts)
    feeds = []
    for pre, t in texts:
        ids = np.array([tok.encode(pre + t).ids[:512]], np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})

    def embed(path: Path) -> np.ndarray:
        s = ort.InferenceSession(str(path), convert.int8_session_options(2), providers=["CPUExecutionProvider"])
        rows = [s.run(["sentence_embedding"], f)[0][0] for f in feeds]
        e = np.stack(rows)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    ref = embed(fp32)
    names = [n.name for n in onnx.load(str(fp32), load_external_data=False).graph.node if n.op_type == "MatMul"]
    suspects = [n for n in names if "attn_out" in n or "ffn_out" in n]
    print(f"{len(texts)} calibration texts (HotpotQA train sample), {len(names)} MatMuls, "
          f"{len(suspects)} suspects, target worst cosine {args.target}", flush=True)
    kept: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q.onnx"

        def score(excl: list[str]) -> tuple[float, float]:
            convert.quantize_int8(fp32, q, excl)
            c = (embed(q) * ref).sum(1)
            return float(c.min()), float(c.mean())

        worst, mean = score(kept)
        print(f"all int8: worst {worst:.4f} mean {mean:.4f}", flush=True)
        while worst < args.target and len(kept) < len(suspects):
            trials = []
            for s in suspects:
                if s in kept:
                    continue
                w, m = score(kept + [s])
                trials.append((w, m, s))
                print(f"  fp32 {kept + [s]}: worst {w:.4f} mean {m:.4f}", flush=True)
            worst, mean, best = max(trials)
            kept.append(best)
            print(f"keep {best} in fp32: worst {worst:.4f} mean {mean:.4f}", flush=True)
    print(f"INT8_FP32_MATMULS = {kept!r}")


if __name__ == "__main__":
    main()
