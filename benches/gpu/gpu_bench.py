#!/usr/bin/env python3
"""GPU-machine side of the GPU benchmark (see benches/gpu/README.md).

Needs only numpy, plus torch (and transformers when present) for the
baseline: it runs under the GPU machine's own Python.

  gpu_bench.py materialize MODEL_DIR        weights from recipe.json (seeded)
  gpu_bench.py check GOT.npy WANT.npy       min/mean cosine as JSON
  gpu_bench.py torch --corpus DIR ...       PyTorch fp16 BERT(E5-large) tokens/s as JSON
  gpu_bench.py report RESULTS_DIR OUT       gpu_report.json + gpu_report.svg
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def materialize(model_dir: Path) -> None:
    recipe = json.loads((model_dir / "recipe.json").read_text())
    rng = np.random.default_rng(recipe["seed"])
    path = model_dir / recipe["data"]
    t0 = time.time()
    with open(path, "wb") as f:
        f.truncate(recipe["size"])
        for t in recipe["tensors"]:
            shape, dtype = tuple(t["shape"]), np.dtype(t["dtype"])
            if t["fill"] == "zeros":
                continue  # the file is already zero there
            if t["fill"] == "ones":
                arr = np.ones(shape, dtype)
            else:
                arr = (rng.standard_normal(shape, dtype=np.float32) * t["std"]).astype(dtype)
            assert arr.nbytes == t["length"], t["name"]
            f.seek(t["offset"])
            f.write(arr.tobytes())
    print(json.dumps({"materialized": str(path), "bytes": recipe["size"], "seconds": round(time.time() - t0, 1)}))


def check(got: Path, want: Path) -> None:
    a, b = np.load(got).astype(np.float64), np.load(want).astype(np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    print(json.dumps({"texts": len(cos), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                      "worst_index": int(cos.argmin())}))


def batches(lens: np.ndarray, mode: str, batch_tokens: int, max_rows: int) -> list[np.ndarray]:
    """``sorted``: the same plan as SCD (ascending length, padded tokens under
    the budget, row cap). ``naive``: input order, fixed ``max_rows`` rows."""
    if mode == "naive":
        return [np.arange(i, min(i + max_rows, len(lens))) for i in range(0, len(lens), max_rows)]
    order = np.argsort(lens, kind="stable")
    out, cur = [], []
    for i in order:
        if cur and ((len(cur) + 1) * lens[i] > batch_tokens or len(cur) >= max_rows):
            out.append(np.array(cur))
            cur = []
        cur.append(i)
    if cur:
        out.append(np.array(cur))
    return out


def torch_baseline(args) -> None:
    import torch

    ids = np.load(args.corpus / "ids.npy")
    offsets = np.load(args.corpus / "offsets.npy")
    lens = np.diff(offsets)
    dev = torch.device("cuda")
    impl = "transformers"
    try:
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, max_position_embeddings=512, layer_norm_eps=1e-12)
        torch.manual_seed(0)
        with dev:
            try:
                model = BertModel(cfg, add_pooling_layer=False, attn_implementation="sdpa")
            except TypeError:
                model = BertModel(cfg, add_pooling_layer=False)
        model = model.half().eval()
        impl += f" {__import__('transformers').__version__} sdpa"
    except ImportError:
        model, impl = None, "unavailable"
    if model is None:
        print(json.dumps({"error": "transformers is not installed"}))
        return
    plan = batches(lens, args.mode, args.batch_tokens, args.max_rows)
    # host tensors built ahead: the timed loop is copy + model + pooling + copy back
    host = []
    for b in plan:
        L = int(lens[b].max())
        x = np.zeros((len(b), L), np.int64)
        m = np.zeros((len(b), L), np.int64)
        for r, i in enumerate(b):
            x[r, : lens[i]] = ids[offsets[i]: offsets[i + 1]]
            m[r, : lens[i]] = 1
        host.append((torch.from_numpy(x).pin_memory(), torch.from_numpy(m).pin_memory()))

    def run(batches_):
        out = []
        with torch.inference_mode():
            for x, m in batches_:
                x, m = x.to(dev, non_blocking=True), m.to(dev, non_blocking=True)
                h = model(input_ids=x, attention_mask=m).last_hidden_state
                mf = m.unsqueeze(-1).to(h.dtype)
                v = (h * mf).sum(1).float() / mf.sum(1).float()
                out.append(torch.nn.functional.normalize(v, dim=-1).cpu())
        torch.cuda.synchronize()
        return out

    run(host[: min(8, len(host))])  # warm-up
    t0 = time.time()
    run(host)
    secs = time.time() - t0
    tokens = int(lens.sum())
    padded = int(sum(len(b) * lens[b].max() for b in plan))
    print(json.dumps({"impl": impl, "torch": torch.__version__, "mode": args.mode, "batch_tokens": args.batch_tokens,
                      "max_rows": args.max_rows, "batches": len(plan), "tokens": tokens, "padded_tokens": padded,
                      "seconds": secs, "tokens_per_s": tokens / secs, "gpu": torch.cuda.get_device_name(0)}))


def report(results: Path, out: Path) -> None:
    rows = {}
    for f in sorted(results.glob("*.json")):
        try:
            rows[f.stem] = json.loads(f.read_text())
        except json.JSONDecodeError:
            rows[f.stem] = {"error": f.read_text()[-500:]}
    scd = {k: v for k, v in rows.items() if k.startswith("scd_") and "tokens_per_s" in v}
    torch_ = {k: v for k, v in rows.items() if k.startswith("torch_") and "tokens_per_s" in v}
    best_scd = max(scd.values(), key=lambda v: v["tokens_per_s"], default=None)
    summary: dict = {}
    checks = {k: v["min_cosine"] for k, v in rows.items() if k.startswith("cos_") and "min_cosine" in v}
    if checks:
        summary["gpu_vs_cpu_min_cosine"] = checks
        summary["gpu_vs_cpu_meets_0.999"] = all(c >= 0.999 for c in checks.values())
    summary["providers"] = sorted({v.get("provider") for k, v in rows.items() if "provider" in v})
    if best_scd:
        summary["best_scd"] = {"run": best_scd.get("model"), "batch_tokens": best_scd.get("batch_tokens"),
                               "tokens_per_s": best_scd["tokens_per_s"], "target_tokens_per_s": 300_000,
                               "meets_target": best_scd["tokens_per_s"] >= 300_000}
        for k, v in torch_.items():
            summary[f"ratio_vs_{k}"] = best_scd["tokens_per_s"] / v["tokens_per_s"]
    summary["results"] = rows
    (out / "gpu_report.json").write_text(json.dumps(summary, indent=1))
    bars = [(k, v["tokens_per_s"]) for k, v in list(scd.items()) + list(torch_.items())]
    if bars:
        top = max(b for _, b in bars)
        h = 30 * len(bars) + 60
        svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="760" height="{h}" font-family="sans-serif" '
               'font-size="12">', '<text x="10" y="20" font-size="14">E5-large architecture, tokens/s on one GPU '
               '(same corpus; higher is better)</text>']
        for i, (k, v) in enumerate(bars):
            y = 40 + 30 * i
            w = 420 * v / top
            color = "#3b7dd8" if k.startswith("scd_") else "#d8843b"
            svg += [f'<text x="10" y="{y + 15}">{k}</text>',
                    f'<rect x="250" y="{y}" width="{w:.0f}" height="20" fill="{color}"/>',
                    f'<text x="{255 + w:.0f}" y="{y + 15}">{v:,.0f}</text>']
        svg.append("</svg>")
        (out / "gpu_report.svg").write_text("\n".join(svg))
    print(json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("materialize").add_argument("model_dir", type=Path)
    c = sub.add_parser("check")
    c.add_argument("got", type=Path)
    c.add_argument("want", type=Path)
    t = sub.add_parser("torch")
    t.add_argument("--corpus", type=Path, required=True)
    t.add_argument("--mode", choices=["sorted", "naive"], default="sorted")
    t.add_argument("--batch-tokens", type=int, default=16384)
    t.add_argument("--max-rows", type=int, default=1024)
    r = sub.add_parser("report")
    r.add_argument("results", type=Path)
    r.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "materialize":
        materialize(args.model_dir)
    elif args.cmd == "check":
        check(args.got, args.want)
    elif args.cmd == "torch":
        torch_baseline(args)
    else:
        report(args.results, args.out)


if __name__ == "__main__":
    sys.exit(main())
