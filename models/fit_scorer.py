"""Fits the learned scorer: a linear scorer over the
per-chunk features `scd eval --dump-features` writes (one JSON line per
chunk: set, id, label, tokens, x), on the datasets' train samples.

The model is a softmax over each example's chunks (the loss: the
evidence chunks' mean negative log-probability), its weights pulled toward
the hand-weighted sum's by an L2 penalty whose strength is chosen by
leave-one-set-out cross-validation (fit on
two sets, judge on the third, for each), and the result is checked by k
folds grouped by example. Judged by log-loss and by a per-example proxy of
recall: the share of gold chunks among the top chunks by score that fit a
third of the example's tokens (what packing at 3x would take, without
closure). The final model is fitted on every row and written as the
engine's `scorer.json`; the report (folds included) goes to stdout and,
with --report, to a JSON file.

    .tools/venv/bin/python models/fit_scorer.py feats_*.jsonl \
        --out engine/src/extract/scorer.json --report benches/results/scorer_cv.json
"""

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

BASE = [
    "dense_z", "dense", "lexical_z", "group_best", "link_title", "link_defined", "link_mention",
    "link_owner", "hop_z", "hop_on", "lead", "position", "group_size", "group_rank", "dense_rank", "tokens",
]
FEATURES = BASE + ["title_lead"]


def load(paths):
    sets, ids, y, tok, X = [], [], [], [], []
    for p in paths:
        with open(p) as f:
            for line in f:
                r = json.loads(line)
                sets.append(r["set"])
                ids.append(r["set"] + "/" + r["id"])
                y.append(r["label"])
                tok.append(r["tokens"])
                X.append(r["x"])
    X = np.asarray(X, dtype=np.float64)
    if X.shape[1] == len(BASE):
        # dumps from before `title_lead` was a feature
        X = derive(X)
    if X.shape[1] != len(FEATURES):
        sys.exit(f"rows have {X.shape[1]} features; this script knows {len(FEATURES)}")
    return np.asarray(sets), np.asarray(ids), np.asarray(y, dtype=np.float64), np.asarray(tok), X


def fit(X, y, lam, w_pos=1.0):
    """Newton's method on the L2-penalised log-loss (intercept unpenalised)."""
    mean, std = X.mean(0), X.std(0)
    std[std < 1e-6] = 1.0
    Z = np.hstack([(X - mean) / std, np.ones((len(X), 1))])
    w = np.zeros(Z.shape[1])
    sw = np.where(y > 0, w_pos, 1.0)
    pen = np.full(Z.shape[1], lam)
    pen[-1] = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-Z @ w))
        g = Z.T @ (sw * (p - y)) / len(y) + pen * w
        H = (Z * (sw * p * (1 - p))[:, None]).T @ Z / len(y) + np.diag(pen + 1e-9)
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return {"mean": mean, "std": std, "w": w[:-1], "b": w[-1]}


# the hand-weighted sum's weights over the same features (its defaults:
# lexical 0.3, field 0.5, link 2.0, lead link bonus 1.5, owner link 1.0,
# second hop 0.5); `title_lead` is link_title x lead, derived
HAND = {"dense_z": 1.0, "lexical_z": 0.3, "group_best": 0.5, "link_title": 2.0, "title_lead": 1.0,
        "link_defined": 3.0, "link_mention": 2.0, "link_owner": 1.0, "hop_z": 0.5}


def derive(X):
    """The derived columns the engine computes too (see FEATURES)."""
    f = {n: k for k, n in enumerate(BASE)}
    return np.hstack([X, (X[:, f["link_title"]] * X[:, f["lead"]])[:, None]])


def fit_listwise(X, y, ids, lam, iters=400):
    """Per example, a softmax over its chunks; the loss is the mean
    negative log-probability of its evidence chunks. L2 pulls the weights
    toward the hand sum's, in units of each feature's spread: a large
    lambda is the hand sum, a small one the data's own choice."""
    std = X.std(0)
    std[std < 1e-6] = 1.0
    h = np.array([HAND.get(n, 0.0) for n in FEATURES])
    w = h.copy()
    groups = defaultdict(list)
    for i, e in enumerate(ids):
        groups[e].append(i)
    groups = [np.asarray(g) for g in groups.values() if y[g].sum() > 0]
    m_, v_ = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, iters + 1):
        g = np.zeros_like(w)
        for rows in groups:
            s = X[rows] @ w
            s -= s.max()
            p = np.exp(s)
            p /= p.sum()
            pos = y[rows] > 0
            # d/dw of -mean(log p_pos) = E_p[x] - mean(x_pos)
            g += X[rows].T @ p - X[rows][pos].mean(0)
        g = g / len(groups) + 2 * lam * (w - h) * std**2
        m_ = 0.9 * m_ + 0.1 * g
        v_ = 0.999 * v_ + 0.001 * g * g
        w -= 0.05 * (m_ / (1 - 0.9**t)) / (np.sqrt(v_ / (1 - 0.999**t)) + 1e-8)
    return {"mean": np.zeros(len(w)), "std": np.ones(len(w)), "w": w, "b": 0.0}


def logits(m, X):
    return ((X - m["mean"]) / m["std"]) @ m["w"] + m["b"]


def judge(m, X, y, ids, tok):
    return proxy(logits(m, X), y, ids, tok)


def proxy(s, y, ids, tok, frac=1 / 3):
    """Per example: the share of its gold chunks among the best-scored
    chunks that fit `frac` of its tokens (greedy, skipping what does not fit)."""
    by = defaultdict(list)
    for i, e in enumerate(ids):
        by[e].append(i)
    recalls = []
    for rows in by.values():
        rows = np.asarray(rows)
        gold = y[rows].sum()
        if gold == 0:
            continue
        budget = tok[rows].sum() * frac
        used, got = 0, 0.0
        for i in rows[np.argsort(-s[rows], kind="stable")]:
            if used + tok[i] > budget:
                continue
            used += tok[i]
            got += y[i]
        recalls.append(got / gold)
    return {"recall_at_3x": round(float(np.mean(recalls)), 4), "examples": len(recalls)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--lambdas", default="0.001,0.01,0.1,1,10")
    ap.add_argument("--drop", default="", help="features left out (their weight stays 0), comma-separated")
    args = ap.parse_args()
    sets, ids, y, tok, X = load(args.dumps)
    for name in filter(None, args.drop.split(",")):
        if name not in FEATURES:
            sys.exit(f"--drop {name}: not a feature ({', '.join(FEATURES)})")
        X[:, FEATURES.index(name)] = 0.0
    names = sorted(set(sets))
    print(f"{len(y)} chunks ({int(y.sum())} evidence) of {len(set(ids))} examples in {names}")
    lambdas = [float(v) for v in args.lambdas.split(",")]

    # the hand-weighted sum at its default weights, over the same features
    hand_w = np.array([HAND.get(n, 0.0) for n in FEATURES])

    def hand(Xs):
        return Xs @ hand_w

    report = {"features": FEATURES, "rows": int(len(y)), "evidence": int(y.sum()), "sets": names, "loso": {}, "kfold": []}

    # leave one set out: the choice of lambda is by mean held-out recall proxy
    best = None
    for lam in lambdas:
        per = {}
        for held in names:
            tr, te = sets != held, sets == held
            m = fit_listwise(X[tr], y[tr], ids[tr], lam)
            per[held] = judge(m, X[te], y[te], ids[te], tok[te])
        mean_rec = float(np.mean([v["recall_at_3x"] for v in per.values()]))
        report["loso"][str(lam)] = {"per_set": per, "mean_recall_at_3x": round(mean_rec, 4)}
        print(f"LOSO lambda={lam}: " + ", ".join(f"{k} {v['recall_at_3x']:.4f}" for k, v in per.items()) + f"; mean {mean_rec:.4f}")
        if best is None or mean_rec > best[1]:
            best = (lam, mean_rec)
    lam = best[0]
    # the hand sum on the same held-out sets, same proxy
    hand_per = {held: proxy(hand(X[sets == held]), y[sets == held], ids[sets == held], tok[sets == held]) for held in names}
    report["hand_per_set"] = hand_per
    print("hand sum (default weights), same proxy: " + ", ".join(f"{k} {v['recall_at_3x']:.4f}" for k, v in hand_per.items()))

    # k folds grouped by example, at the chosen lambda
    uniq = np.array(sorted(set(ids)))
    rng = np.random.default_rng(27)
    rng.shuffle(uniq)
    fold_of = {e: k % args.folds for k, e in enumerate(uniq)}
    fold = np.array([fold_of[e] for e in ids])
    for k in range(args.folds):
        tr, te = fold != k, fold == k
        m = fit_listwise(X[tr], y[tr], ids[tr], lam)
        r = judge(m, X[te], y[te], ids[te], tok[te])
        h = proxy(hand(X[te]), y[te], ids[te], tok[te])
        r["hand_recall_at_3x"] = h["recall_at_3x"]
        report["kfold"].append(r)
        print(f"fold {k}: learned {r['recall_at_3x']:.4f}, hand {h['recall_at_3x']:.4f}")

    m = fit_listwise(X, y, ids, lam)
    out = {
        "features": FEATURES,
        "mean": [round(float(v), 6) for v in m["mean"]],
        "std": [round(float(v), 6) for v in m["std"]],
        "weights": [round(float(v), 6) for v in m["w"]],
        "bias": round(float(m["b"]), 6),
        "lambda": lam,
        "fitted_on": {n: int((sets == n).sum()) for n in names},
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    report["chosen_lambda"] = lam
    report["weights"] = dict(zip(FEATURES, out["weights"]))
    print(f"chosen lambda {lam}; weights: " + ", ".join(f"{k} {v:+.3f}" for k, v in report["weights"].items()) + f"; bias {out['bias']:+.3f}")
    print(f"wrote {args.out}")
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
