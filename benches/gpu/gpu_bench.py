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


def TorchBert():
    """E5-large-shaped post-LN BERT on torch's fused attention: the baseline
    when transformers is not installed."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    H, NL, NH, FF = 1024, 24, 16, 4096

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = nn.Linear(H, 3 * H), nn.Linear(H, H)
            self.fi, self.fo = nn.Linear(H, FF), nn.Linear(FF, H)
            self.ln1, self.ln2 = nn.LayerNorm(H, eps=1e-12), nn.LayerNorm(H, eps=1e-12)

        def forward(self, x, bias):
            B, L, _ = x.shape
            q, k, v = self.qkv(x).view(B, L, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(B, L, H)
            x = self.ln1(x + self.o(a))
            return self.ln2(x + self.fo(F.gelu(self.fi(x))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos, self.typ = nn.Embedding(30522, H), nn.Embedding(512, H), nn.Embedding(2, H)
            self.ln = nn.LayerNorm(H, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(NL))

        def forward(self, ids, mask):
            L = ids.shape[1]
            x = self.ln(self.word(ids) + self.pos.weight[:L] + self.typ.weight[0])
            bias = ((1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0)
            for layer in self.layers:
                x = layer(x, bias)
            return x

    return Bert()


def torch_baseline(args) -> None:
    import torch

    ids = np.load(args.corpus / "ids.npy")
    offsets = np.load(args.corpus / "offsets.npy")
    lens = np.diff(offsets)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    try:
        import transformers
        from transformers import BertConfig, BertModel

        base = dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                    intermediate_size=4096, max_position_embeddings=512, layer_norm_eps=1e-12)
        try:
            cfg = BertConfig(**base, attn_implementation="sdpa")
        except TypeError:
            cfg = BertConfig(**base)
        with dev:
            model = BertModel(cfg, add_pooling_layer=False)
        attn = getattr(model.config, "_attn_implementation", "?")
        impl = f"transformers {transformers.__version__} BertModel, attention {attn}"

        def encode(x, m):
            return model(input_ids=x, attention_mask=m).last_hidden_state
    except ImportError:
        model = TorchBert().to(dev)
        impl = "hand-written post-LN BERT (transformers absent), scaled_dot_product_attention"

        def encode(x, m):
            return model(x, m)
    model = model.half().eval()
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
                h = encode(x, m)
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
    for stem in sorted({f.stem for f in results.glob("*.json")} | {f.stem for f in results.glob("*.err")}):
        f, err = results / f"{stem}.json", results / f"{stem}.err"
        try:
            rows[stem] = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            rows[stem] = {"error": (err.read_text() if err.exists() else "no output")[-500:]}
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
