"""Chooses the follow-up floor (`more_min_relevance`) by cross-validation
over `scd-dev eval --adaptive` reports of one set, one report per (floor,
follow-up budget), each run with `--sweep more_min_relevance=F` (-1: off).

The rule: the highest floor at which the rows (follow-up budget, first
budget) keep every supporting paragraph of as many questions on average
as with the floor off. (Requiring it of every row was too noisy: one
question flipped in one row of four folds made a fold choose no floor.) For each fold (example i in fold i mod k, as the eval's report
splits them), the floor is chosen by the rule on the other folds and the
held fold is reported at it: the loop's all-kept beside the floor off, and
the off-topic probes that got nothing. Then the rule on all folds.

    python3 benches/scripts/floor_cv.py REPORT.json... [--json OUT.json]
"""

import argparse
import json
import re


def load(paths):
    """(floor, hop budget, first budget) -> the report's per-fold summaries."""
    runs = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        m = re.search(r"more_min_relevance=(-?[0-9.]+)", r["settings"])
        if not m:
            raise SystemExit(f"{p}: settings {r['settings']!r} name no more_min_relevance")
        for row in r["results"]:
            runs[(float(m.group(1)), row["hop_budget"], row["first_budget"])] = row["folds"]
    return runs


def mean(folds, ks, key):
    n = sum(folds[k]["examples"] for k in ks)
    return sum(folds[k][key] * folds[k]["examples"] for k in ks) / n


def choose(runs, floors, rows, ks):
    """The highest floor losing no all-kept on folds `ks`, averaged over the rows."""
    def kept(f):
        return sum(mean(runs[(f, *row)], ks, "adaptive_all_kept") for row in rows) / len(rows)
    # the reports hold f32s: a difference under a thousandth of a question is none
    return max(f for f in floors if kept(f) >= kept(-1.0) - 1e-4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--json")
    args = ap.parse_args()
    runs = load(args.reports)
    floors = sorted({f for f, _, _ in runs})
    rows = sorted({(h, b) for _, h, b in runs})
    if -1.0 not in floors:
        raise SystemExit("no report with the floor off (more_min_relevance=-1)")
    k = len(next(iter(runs.values())))
    out = {"floors": floors, "rows": [list(r) for r in rows], "folds": []}
    print(f"floors {floors}; rows (follow-up budget, first budget) {rows}; {k} folds")
    for held in range(k):
        rest = [j for j in range(k) if j != held]
        f = choose(runs, floors, rows, rest)
        kept = [(runs[(-1.0, *row)][held]["adaptive_all_kept"], runs[(f, *row)][held]["adaptive_all_kept"]) for row in rows]
        empty = [runs[(f, *row)][held]["off_topic_empty"] for row in rows]
        print(f"fold {held}: chosen on the others {f}; held fold all kept off -> chosen "
              + " ".join(f"{a:.3f}->{b:.3f}" for a, b in kept)
              + f"; off-topic probes empty {min(empty):.3f}-{max(empty):.3f}")
        out["folds"].append({"fold": held, "chosen": f, "all_kept_off": [a for a, _ in kept],
                             "all_kept_chosen": [b for _, b in kept], "off_topic_empty": empty})
    f = choose(runs, floors, rows, list(range(k)))
    print(f"all folds: {f}")
    for row in rows:
        line = " ".join(f"{g}:{mean(runs[(g, *row)], range(k), 'adaptive_all_kept'):.3f}/"
                        f"{mean(runs[(g, *row)], range(k), 'off_topic_empty'):.2f}" for g in floors)
        print(f"  follow-ups {row[0]}, first {row[1]}: floor:all-kept/off-topic-empty {line}")
    out["chosen"] = f
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
