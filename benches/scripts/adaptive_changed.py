"""Two `scd-dev eval --adaptive --per-example` files of one run's examples,
compared: per first-answer budget, the share of examples whose every
supporting paragraph the loop kept, before and after, the difference in
each fold (example i in fold i mod k, as the eval's report splits them),
how many examples gained and lost, and the supporting paragraphs the loop
missed, before and after: sent in part (a chunk of the paragraph went) or
not at all. Plain or gzipped JSON lines.

    python3 benches/scripts/adaptive_changed.py BEFORE.jsonl[.gz] AFTER.jsonl[.gz] [--folds 5]
"""

import argparse
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def missed(rows):
    """(sent in part, not sent) among the supporting paragraphs the loop missed."""
    part = none = 0
    for r in rows:
        fields = {c.rsplit("#", 1)[0] for s in r["steps"] for c in s["chunks"]}
        for g in r["gold"]:
            if not g["adaptive"]:
                if g["field"] in fields:
                    part += 1
                else:
                    none += 1
    return part, none


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--folds", type=int, default=5)
    args = ap.parse_args()
    a, b = load(args.before), load(args.after)
    for budget in sorted({r["first_budget"] for r in a}):
        x = [r for r in a if r["first_budget"] == budget]
        y = [r for r in b if r["first_budget"] == budget]
        if [r["id"] for r in x] != [r["id"] for r in y]:
            raise SystemExit(f"first budget {budget}: the files hold different examples")
        kept = lambda rows: [int(r["adaptive_all_kept"]) for r in rows]
        kx, ky = kept(x), kept(y)
        folds = []
        for k in range(args.folds):
            idx = range(k, len(kx), args.folds)
            folds.append(sum(ky[i] - kx[i] for i in idx) / len(idx))
        gained = sum(1 for p, q in zip(kx, ky) if q > p)
        lost = sum(1 for p, q in zip(kx, ky) if p > q)
        print(
            f"first {budget:.2f}: all kept {sum(kx) / len(kx):.3f} -> {sum(ky) / len(ky):.3f}, "
            f"by fold {' '.join(f'{d:+.3f}' for d in folds)}; gained {gained}, lost {lost} of {len(kx)}; "
            "missed paragraphs (in part, not sent) {} -> {}".format(missed(x), missed(y))
        )


if __name__ == "__main__":
    main()
