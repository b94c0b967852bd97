#!/usr/bin/env python3
"""Cross-validation by crate over `scd-dev eval --per-example` output.

Usage: cv_folds.py PER_EXAMPLE.jsonl [--folds 5] [--prefix scd]

Examples are grouped by crate (the part of the id before the first `/`);
crates, sorted by name, are dealt round-robin into folds. For each fold, the
SCD setting (a method whose name starts with --prefix) with the best mean
recall over the budgets on the other folds is chosen, and its recall on the
held-out fold is reported beside every fixed method's. Standard library only.
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--prefix", default="scd")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.path) if l.strip()]
    crate = lambda r: r["id"].split("/")[0]
    crates = sorted({crate(r) for r in rows})
    fold_of = {c: i % a.folds for i, c in enumerate(crates)}
    budgets = sorted({round(r["budget"], 3) for r in rows})
    for r in rows:
        r["budget"] = round(r["budget"], 3)
    methods = sorted({r["method"] for r in rows})
    # recall[(method, budget, fold)] -> list
    rec = collections.defaultdict(list)
    for r in rows:
        rec[(r["method"], r["budget"], fold_of[crate(r)])].append(float(r["all_kept"]))

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    def score(m, folds, b=None):
        bs = budgets if b is None else [b]
        return mean([x for bb in bs for f in folds for x in rec[(m, bb, f)]])

    tuned = [m for m in methods if m.startswith(a.prefix)]
    fixed = [m for m in methods if not m.startswith(a.prefix)]
    print(f"{len(rows)} rows, {len(crates)} crates, {a.folds} folds by crate; kept = gold function >= 90% of lines")
    head = "fold  n   chosen setting (tuned on the other folds)" + "".join(
        f"  {'tuned@' + str(b):>10}" for b in budgets
    ) + "".join(f"  {m + '@' + str(b):>14}" for m in fixed for b in budgets)
    print(head)
    tot = collections.defaultdict(list)
    for f in range(a.folds):
        train = [g for g in range(a.folds) if g != f]
        best = max(tuned, key=lambda m: score(m, train))
        n = len(rec[(best, budgets[0], f)])
        line = f"{f:>4} {n:>3}   {best:<42}"
        for b in budgets:
            v = score(best, [f], b)
            tot[("tuned", b)].extend(rec[(best, b, f)])
            line += f"  {v:>10.3f}"
        for m in fixed:
            for b in budgets:
                line += f"  {score(m, [f], b):>14.3f}"
                tot[(m, b)].extend(rec[(m, b, f)])
        print(line)
    line = "all  " + f"{len(tot[('tuned', budgets[0])]):>3}   {'(held-out folds pooled)':<42}"
    for b in budgets:
        line += f"  {mean(tot[('tuned', b)]):>10.3f}"
    for m in fixed:
        for b in budgets:
            line += f"  {mean(tot[(m, b)]):>14.3f}"
    print(line)
    print("\nevery setting on all folds:")
    for m in methods:
        print(f"  {m:<48}" + "".join(f"  @{b}: {score(m, range(a.folds), b):.3f}" for b in budgets))


if __name__ == "__main__":
    main()
