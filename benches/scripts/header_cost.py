"""What the header lines cost packed recall: each `scd-dev eval
--dump-features` dump packed as models/fit_scorer.py packs it (the engine's
packing, but with a paragraph's pieces priced as the text prints them,
where the engine's packer charges a header per run of adjacent chunks;
BENCHMARKS.md) with a scorer.json's weights, with
each piece paying its header line and with headers free, at a third and a
quarter of each example's tokens.

    .tools/venv/bin/python benches/scripts/header_cost.py [--closure-share 0.4] \
        engine/src/extract/scorer.json DUMP.jsonl...
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "models"))
import numpy as np  # noqa: E402

import fit_scorer as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closure-share", type=float, default=F.CLOSURE_SHARE)
    ap.add_argument("scorer", help="a scorer.json")
    ap.add_argument("dumps", nargs="+")
    args = ap.parse_args()
    w = F.shipped_weights(args.scorer)
    print(f"closure share {args.closure_share}")
    print(f"{'dump':<28} {'headers':>8} {'free':>8} {'cost':>7} {'tokens/header':>14}")
    for path in args.dumps:
        examples = F.load([path], args.closure_share)
        paid = F.per_set(examples, w)
        mean_header = np.mean([h for e in examples for h in e.header])
        for e in examples:
            e.header = [0] * len(e.header)
        free = F.per_set(examples, w)
        for name in paid:
            print(f"{os.path.basename(path):<28} {paid[name]:>8.5f} {free[name]:>8.5f} "
                  f"{free[name] - paid[name]:>7.5f} {mean_header:>14.1f}")


if __name__ == "__main__":
    main()
