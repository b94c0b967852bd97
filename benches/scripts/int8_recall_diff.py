#!/usr/bin/env python3
"""Recall of `scd@e5-small-int8` against `scd` (fp32) at every budget, from
`scd-dev eval --also-model e5-small-int8` reports (one run each). The issue's bar:
within 0.005 at every budget."""
import json
import sys

worst = 0.0
print(f"{'set':9} {'budget':>6} {'fp32':>7} {'int8':>7} {'diff':>7}   all kept fp32 / int8")
for path in sys.argv[1:]:
    rep = json.load(open(path))
    rows = {(r["method"], r["budget"]): r for r in rep["results"]}
    for (m, b), r in sorted(rows.items()):
        if m != "scd":
            continue
        q = rows[("scd@e5-small-int8", b)]
        d = q["evidence_recall"] - r["evidence_recall"]
        worst = min(worst, d) if d < 0 else worst
        print(f"{rep['dataset']:9} {b:6.2f} {r['evidence_recall']:7.3f} {q['evidence_recall']:7.3f} {d:+7.3f}"
              f"   {r['all_evidence_kept']:.3f} / {q['all_evidence_kept']:.3f}")
print(f"largest drop of int8 below fp32: {-worst:.3f} (bar: 0.005)")
