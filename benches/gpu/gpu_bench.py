#!/usr/bin/env python3
"""GPU-machine side of the GPU benchmark (see benches/gpu/README.md).

Needs only numpy, plus torch (and transformers when present) for the
baseline: it runs under the GPU machine's own Python.

  gpu_bench.py materialize MODEL_DIR        weights from recipe.json (seeded)
  gpu_bench.py check GOT.npy WANT.npy       min/mean cosine as JSON
  gpu_bench.py torch --corpus DIR ...       PyTorch fp16 BERT (E5-large or e5-small shape): steady and end to end
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


ARCH = {  # BERT shapes: E5-large and e5-small (multilingual-e5-small: 12 layers, 384 hidden)
    "large": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
    "small": dict(vocab_size=250037, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=1536),
}


def torch_model(arch: str, dev):
    """transformers' ``BertModel`` (SDPA) with the architecture's shapes and
    random weights; the hand-written BERT when transformers is absent."""
    import torch

    torch.manual_seed(0)
    try:
        import transformers
        from transformers import BertConfig, BertModel

        base = dict(ARCH[arch], max_position_embeddings=512, layer_norm_eps=1e-12)
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
        if arch != "large":
            raise
        model = TorchBert().to(dev)
        impl = "hand-written post-LN BERT (transformers absent), scaled_dot_product_attention"

        def encode(x, m):
            return model(x, m)
    model.half().eval()
    return encode, impl


def torch_baseline(args) -> None:
    """Steady state (after a warm-up, passes over the plan until they last
    ``--min-seconds``) and end to end (model creation, host batches, first
    pass) apart, like ``scd embed-batch``'s summary. The timed loop is
    host→device, model, mean pooling, device→host; token ids are given."""
    t_start = time.time()
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"skipped": f"no torch in this Python ({e})"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no GPU (torch.cuda.is_available() is false)", "torch": torch.__version__}))
        return
    ids = np.load(args.corpus / "ids.npy")
    offsets = np.load(args.corpus / "offsets.npy")
    lens = np.diff(offsets)
    dev = torch.device("cuda")
    encode, impl = torch_model(args.arch, dev)
    plan = batches(lens, args.mode, args.batch_tokens, args.max_rows)
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

    tokens = int(lens.sum())
    t0 = time.time()
    run(host)  # the first pass: warm-up included, as a user's one run
    first = time.time() - t0
    end_to_end = {"tokens": tokens, "seconds": time.time() - t_start,
                  "tokens_per_s": tokens / (time.time() - t_start)}
    passes = []
    while sum(p["seconds"] for p in passes) < args.min_seconds:
        t0 = time.time()
        run(host)
        secs = time.time() - t0
        passes.append({"tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs})
    steady_s = sum(p["seconds"] for p in passes)
    steady_tokens = tokens * len(passes)
    padded = int(sum(len(b) * lens[b].max() for b in plan))
    print(json.dumps({"impl": impl, "arch": args.arch, "torch": torch.__version__, "mode": args.mode,
                      "batch_tokens": args.batch_tokens, "max_rows": args.max_rows, "batches": len(plan),
                      "tokens": steady_tokens, "padded_tokens_per_pass": padded, "seconds": steady_s,
                      "tokens_per_s": steady_tokens / steady_s, "first_pass_seconds": first,
                      "timing": {"steady": {"tokens": steady_tokens, "seconds": steady_s,
                                            "tokens_per_s": steady_tokens / steady_s},
                                 "end_to_end": end_to_end, "passes": passes, "min_seconds": args.min_seconds},
                      "gpu": torch.cuda.get_device_name(0)}))


def gpu_busy(csv: Path) -> dict:
    """Summary of ``nvidia-smi --query-gpu=utilization.gpu,memory.used`` samples
    (NVML's busy share: the part of each sample period a kernel ran)."""
    vals = []
    mem = []
    for line in csv.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            vals.append(int(parts[0]))
            mem.append(int(parts[1]) if parts[1].isdigit() else 0)
    if not vals:
        return {"skipped": "no samples"}
    # the first and last samples straddle session creation and exit
    mid = vals[len(vals) // 10: len(vals) - len(vals) // 10] or vals
    return {"samples": len(vals), "busy_mean_pct": float(np.mean(mid)), "busy_p50_pct": float(np.median(mid)),
            "busy_min_pct": int(min(mid)), "memory_max_mib": int(max(mem))}


TARGETS = {"large": {"tokens_per_s": 600_000, "vs_torch": 1.5}, "small": {"tokens_per_s": 2_000_000}}


def run_row(name: str, v: dict, busy: dict | None) -> dict:
    """One throughput run, flattened for the table."""
    t = v.get("timing") or {}
    row = {"run": name, "model": v.get("model") or v.get("impl"), "batch_tokens": v.get("batch_tokens"),
           "steady_tokens_per_s": (t.get("steady") or {}).get("tokens_per_s", v.get("tokens_per_s")),
           "steady_seconds": (t.get("steady") or {}).get("seconds", v.get("seconds")),
           "end_to_end_tokens_per_s": (t.get("end_to_end") or {}).get("tokens_per_s"),
           "passes": len(t.get("passes") or [])}
    ph = t.get("phases")
    if ph:
        e = ph["engine"]
        row.update(workers=t.get("workers"), overlap=t.get("overlap"), padding_share=ph["padding_share"],
                   real_tokens_per_batch=ph["real_tokens_per_batch"],
                   padded_tokens_per_batch=ph["padded_tokens_per_batch"],
                   seconds={k: round(x, 3) for k, x in [("tokenize", ph["tokenize_s"]), ("write", ph["write_s"])]
                            + [(k[:-2], e[k]) for k in ["assemble_s", "wait_s", "h2d_s", "model_s", "d2h_s",
                                                        "pool_s", "total_s"]]})
    if busy:
        row["gpu"] = busy
    return row


def report(results: Path, out: Path) -> None:
    rows = {}
    for stem in sorted({f.stem for f in results.glob("*.json")} | {f.stem for f in results.glob("*.err")}):
        f, err = results / f"{stem}.json", results / f"{stem}.err"
        try:
            rows[stem] = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            rows[stem] = {"error": (err.read_text() if err.exists() else "no output")[-500:]}
    busy = {f.name[: -len(".gpu.csv")]: gpu_busy(f) for f in results.glob("*.gpu.csv")}
    summary: dict = {"rehearsal": bool(rows.get("plan", {}).get("rehearsal")), "plan": rows.get("plan")}
    checks = {k: v["min_cosine"] for k, v in rows.items() if k.startswith("cos_") and "min_cosine" in v}
    if checks:
        summary["parity_min_cosine"] = checks
        summary["parity_meets_0.999"] = all(c >= 0.999 for c in checks.values())
    summary["providers"] = sorted({v.get("provider") for v in rows.values() if "provider" in v})
    summary["gpu_busy"] = busy or {"skipped": "no GPU: nvidia-smi absent, nothing sampled"}
    summary["optimizer"] = {k: v for k, v in rows.items() if k.startswith("optimizer_")}
    table = {}
    for role in ["large", "small"]:
        scd = {k: v for k, v in rows.items() if k.startswith(f"scd_{role}_") and "tokens_per_s" in v}
        torch_ = {k: v for k, v in rows.items() if k.startswith(f"torch_{role}_") and "tokens_per_s" in v}
        runs = [run_row(k, v, busy.get(k)) for k, v in list(scd.items()) + list(torch_.items())]
        table[role] = runs
        best = max((r for r in runs if r["run"].startswith("scd_")), key=lambda r: r["steady_tokens_per_s"],
                   default=None)
        best_t = max((r for r in runs if r["run"].startswith("torch_")), key=lambda r: r["steady_tokens_per_s"],
                     default=None)
        goal = TARGETS[role]
        res = {"target_tokens_per_s": goal["tokens_per_s"]}
        if best:
            res.update(best_scd=best["run"], best_scd_tokens_per_s=best["steady_tokens_per_s"],
                       meets_tokens_per_s=best["steady_tokens_per_s"] >= goal["tokens_per_s"])
        if best and best_t:
            ratio = best["steady_tokens_per_s"] / best_t["steady_tokens_per_s"]
            res.update(best_torch=best_t["run"], best_torch_tokens_per_s=best_t["steady_tokens_per_s"],
                       ratio_vs_best_torch=ratio)
            if "vs_torch" in goal:
                res["meets_vs_torch"] = ratio >= goal["vs_torch"]
        summary[f"best_{role}"] = res
    summary["table"] = table
    summary["errors"] = {k: v["error"][-300:] for k, v in rows.items() if "error" in v}
    # (embed-batch's own "skipped" counts rows already in a resumed output)
    summary["skipped"] = {k: v["skipped"] for k, v in rows.items() if isinstance(v.get("skipped"), str)}
    summary["results"] = rows
    (out / "gpu_report.json").write_text(json.dumps(summary, indent=1))
    plot(table, summary["rehearsal"], out / "gpu_report.svg")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("results", "table")}, indent=1))


def plot(table: dict, rehearsal: bool, path: Path) -> None:
    """Bars per run: steady tokens/s (dark) and end to end (light); SCD blue, PyTorch orange."""
    bars = [(role, r) for role in ["large", "small"] for r in table[role]]
    if not bars:
        return
    h = 26 * len(bars) + 90
    title = ("CPU REHEARSAL, not a measurement: " if rehearsal else "") + \
        "tokens/s per run, steady (dark) and end to end (light)"
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="860" height="{h}" font-family="sans-serif" '
           'font-size="12">', f'<text x="10" y="20" font-size="14">{title}</text>']
    y = 40
    for role in ["large", "small"]:
        runs = table[role]
        if not runs:
            continue
        top = max(max(r["steady_tokens_per_s"] or 0, r["end_to_end_tokens_per_s"] or 0) for r in runs) or 1
        svg.append(f'<text x="10" y="{y + 12}" font-weight="bold">{role}</text>')
        y += 18
        for r in runs:
            scd = r["run"].startswith("scd_")
            dark, light = ("#3b7dd8", "#a9c6ee") if scd else ("#d8843b", "#eec6a9")
            w_e = 420 * (r["end_to_end_tokens_per_s"] or 0) / top
            w_s = 420 * (r["steady_tokens_per_s"] or 0) / top
            svg += [f'<text x="10" y="{y + 14}">{r["run"]}</text>',
                    f'<rect x="300" y="{y}" width="{w_s:.0f}" height="18" fill="{dark}"/>',
                    f'<rect x="300" y="{y + 12}" width="{w_e:.0f}" height="6" fill="{light}"/>',
                    f'<text x="{305 + w_s:.0f}" y="{y + 14}">{r["steady_tokens_per_s"] or 0:,.0f}</text>']
            y += 24
    svg.append("</svg>")
    path.write_text("\n".join(svg))


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
    t.add_argument("--arch", choices=sorted(ARCH), default="large")
    t.add_argument("--min-seconds", type=float, default=20.0)
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
