"""What the header lines cost packed recall: each `scd-dev eval
--dump-features` dump packed as the engine packs it (models/fit_scorer.py)
with a scorer.json's weights, with each piece paying its header line and
with headers free, at a third and a quarter of each example's tokens.

    .tools/venv/bin/python benches/scripts/header_cost.py engine/src/extract/scorer.json DUMP.jsonl...
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "models"))
import numpy as np  # noqa: E402

import fit_scorer as F  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    w = F.shipped_weights(sys.argv[1])
    print(f"{'dump':<28} {'headers':>8} {'free':>8} {'cost':>7} {'tokens/header':>14}")
    for path in sys.argv[2:]:
        examples = F.load([path], 0.4)
        paid = F.per_set(examples, w)
        mean_header = np.mean([h for e in examples for h in e.header])
        for e in examples:
            e.header = [0] * len(e.header)
        free = F.per_set(examples, w)
        for name in paid:
            print(f"{os.path.basename(path):<28} {paid[name]:>8.4f} {free[name]:>8.4f} "
                  f"{free[name] - paid[name]:>7.4f} {mean_header:>14.1f}")


if __name__ == "__main__":
    main()
