"""The cases whose figures differ between two `scd-dev eval --per-example`
files, for one method (default `scd`): per case and budget, gold lines kept
and all kept, before and after, and the tokens sent; then how many gained
and lost.

    python3 benches/scripts/changed_cases.py BEFORE.jsonl AFTER.jsonl [--method scd]
"""

import argparse
import json


def load(path, method):
    with open(path) as f:
        rows = (json.loads(line) for line in f)
        return {(r["id"], r["budget"]): r for r in rows if r["method"] == method}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--method", default="scd")
    args = ap.parse_args()
    a, b = load(args.before, args.method), load(args.after, args.method)
    if a.keys() != b.keys():
        raise SystemExit(f"the files hold different cases: {len(a.keys() ^ b.keys())} differ")
    gained = lost = 0
    for key in sorted(a):
        x, y = a[key], b[key]
        dx, dy = x["gold_lines_kept"], y["gold_lines_kept"]
        if abs(dx - dy) < 1e-9 and x["all_gold_kept"] == y["all_gold_kept"]:
            continue
        gained += dy > dx
        lost += dy < dx
        print(f"{key[0]:<48} {key[1]:>5} lines {dx:.3f} -> {dy:.3f}  all {x['all_gold_kept']!s:>5} -> "
              f"{y['all_gold_kept']!s:<5}  sent {x['sent_tokens']} -> {y['sent_tokens']} of {x['budget_tokens']}")
    print(f"{gained} gained, {lost} lost, of {len(a)} (case, budget)")


if __name__ == "__main__":
    main()
