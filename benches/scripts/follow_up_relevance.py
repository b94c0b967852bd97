"""Per kind, how much a follow-up's question is about the context it is
asked of: the relevance of the unsent chunk nearest its floor (the cosine of the question
with its group's best chunk) that a follow-up reports in `reason` when
nothing reaches the floor. Read from `scd-dev eval --dataset agent
--adaptive --sweep more_min_relevance=0.99 --per-example F` (a floor no
chunk reaches, so every follow-up reports it): the case's own task asked
again (on), another kind's task (off) and, where another case has the same
context, that case's task (2nd), as percentiles, and the share of each kept
at a floor.

    python3 benches/scripts/follow_up_relevance.py F.jsonl[.gz] [--method 'scd[more_min_relevance=0.99]']
"""

import argparse
import gzip
import json
import re


def percentiles(xs, qs=(0.05, 0.25, 0.5, 0.75, 0.95)):
    xs = sorted(xs)
    return [xs[min(len(xs) - 1, int(q * len(xs)))] for q in qs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("per_example")
    ap.add_argument("--method", default="scd[more_min_relevance=0.99]")
    args = ap.parse_args()
    by = {}
    opener = gzip.open if args.per_example.endswith(".gz") else open
    for line in opener(args.per_example, "rt"):
        p = json.loads(line)
        if p["method"] != args.method:
            continue
        for side, key in (("on", "follow_up_reason"), ("off", "off_topic_reason"), ("2nd", "second_reason")):
            if key not in p:
                continue  # no second question about this case's context
            m = re.search(r"has relevance (-?[0-9.]+)", p[key] or "")
            if not m:
                raise SystemExit(f"{p['id']}: {key} reports no relevance: {p[key]!r}")
            by.setdefault(p["kind"], {"on": [], "off": [], "2nd": []})[side].append(float(m.group(1)))
    print("kind   side  n    p5    p25   p50   p75   p95   kept at 0.80 0.82 0.84 0.86")
    for kind, sides in by.items():
        for side, xs in sides.items():
            if not xs:
                continue
            pc = " ".join(f"{x:.3f}" for x in percentiles(xs))
            kept = " ".join(f"{sum(x >= f for x in xs) / len(xs):.2f}" for f in (0.80, 0.82, 0.84, 0.86))
            print(f"{kind:<6} {side:<4} {len(xs):>3}  {pc}   {kept}")


if __name__ == "__main__":
    main()
