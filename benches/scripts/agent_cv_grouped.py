#!/usr/bin/env python3
"""Cross-validation of SCD settings over agent cases, folds grouped by project.

Usage: agent_cv_grouped.py PER_EXAMPLE.jsonl[.gz] [--folds 5] [--baseline METHOD]

`scd-dev eval --dataset agent --sweep ... --folds` deals cases into folds
one by one, so cases cut from one project (pino's docs folder, the wasm
meeting notes) sit on both sides of a split. Here a case's project is the
id's second word (the third for code: `code-py-attrs-...` is `attrs`), and
each kind's projects, largest first, go whole into the fold with the fewest
cases so far (counted over all kinds, so a fold may hold no case of a small
kind). For each fold the setting (every `scd` method of the run; `scd-cv`
left out) with the best score on the other folds is chosen: gold lines
kept, mean over the budgets of the mean over kinds of each kind's mean, as
`scd-dev` scores. Ties go to the default (`scd`). Prints each fold's choice
and held-out score beside --baseline's (the default unless named), every
kind's pooled held-out gold lines kept and all kept beside the baseline's,
and every method's score on every case. Standard library only.
"""
import argparse
import collections
import gzip
import json


def project(case_id):
    words = case_id.split("-")
    return words[2] if words[0] == "code" else words[1]


def folds_by_project(rows, k):
    """Each case id's fold: each kind's projects, largest first, each into
    the fold with the fewest cases so far."""
    cases = collections.defaultdict(set)
    for r in rows:
        cases[(r["kind"], project(r["id"]))].add(r["id"])
    fold_of, load = {}, [0] * k
    for (kind, _), ids in sorted(cases.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        f = min(range(k), key=lambda i: (load[i], i))
        load[f] += len(ids)
        fold_of.update((i, f) for i in ids)
    return fold_of


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def score(table, method, ids):
    """Mean over budgets of the mean over kinds of each kind's mean."""
    per_budget = []
    for b in sorted({b for (m, b, _) in table if m == method}):
        kinds = collections.defaultdict(list)
        for (m, bb, i), (kind, lines, _) in table.items():
            if m == method and bb == b and i in ids:
                kinds[kind].append(lines)
        per_budget.append(mean([mean(v) for v in kinds.values()]))
    return mean(per_budget)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--baseline", default="scd", help="the method the held-out figures are set beside")
    a = ap.parse_args()
    with (gzip.open(a.path, "rt") if a.path.endswith(".gz") else open(a.path)) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    rows = [r for r in rows if r["method"].startswith("scd") and r["method"] != "scd-cv"]
    table = {
        (r["method"], round(r["budget"], 3), r["id"]): (r["kind"], r["gold_lines_kept"], r["all_gold_kept"])
        for r in rows
    }
    methods = sorted({r["method"] for r in rows}, key=lambda m: (m != "scd", m))
    fold_of = folds_by_project(rows, a.folds)
    every = set(fold_of)
    chosen_for = {}
    print(f"{a.folds} folds grouped by project; score: gold lines kept (mean over budgets of the mean over kinds)")
    base = a.baseline
    print(f"fold cases  chosen on the others                                   test  {base}")
    for f in range(a.folds):
        test = {i for i in every if fold_of[i] == f}
        train = every - test
        best = max(methods, key=lambda m: (round(score(table, m, train), 9), m == "scd"))
        chosen_for[f] = best
        print(f"{f:>4} {len(test):>5}  {best:<52} {score(table, best, test):.3f}  {score(table, base, test):.3f}")
    held = {(b, i): table[(chosen_for[fold_of[i]], b, i)] for (m, b, i) in table if m == "scd"}
    print(f"held out, per kind and budget: gold lines kept / all kept ({base}'s)")
    for kind in sorted({k for (k, _, _) in held.values()}):
        for b in sorted({b for (b, _) in held}, reverse=True):
            cv = [v for (bb, i), v in held.items() if bb == b and v[0] == kind]
            d = [table[(base, b, i)] for (bb, i) in held if bb == b and table[(base, b, i)][0] == kind]
            print(
                f"  {kind:<5} {b:.2f}  {mean([v[1] for v in cv]):.3f} / {mean([float(v[2]) for v in cv]):.3f}"
                f"  ({mean([v[1] for v in d]):.3f} / {mean([float(v[2]) for v in d]):.3f})"
            )
    pooled = {("cv", b, i): v for (b, i), v in held.items()}
    print(f"cross-validated {score(pooled, 'cv', every):.3f} ({base} {score(table, base, every):.3f})")
    print("every method on every case: " + ", ".join(f"{m} {score(table, m, every):.3f}" for m in methods))


if __name__ == "__main__":
    main()
