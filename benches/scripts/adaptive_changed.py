"""Two `scd-dev eval --adaptive --per-example` files of one run's examples,
compared: per first-answer budget, the share of examples whose every
supporting paragraph the loop kept, before and after, the difference in
each fold (example i in fold i mod k, as the eval's report splits them),
how many examples gained and lost, and the supporting paragraphs the loop
missed, before and after: sent in part (a chunk of the paragraph went) or
not at all; of those sent in part, how many only by the first answer, of
those how many as a single chunk, and of those how many as the paragraph's
first (`#0`). Last, the share of the follow-ups' budgets they sent. Plain
or gzipped JSON lines.

    python3 benches/scripts/adaptive_changed.py BEFORE.jsonl[.gz] AFTER.jsonl[.gz] [--folds 5]
"""

import argparse
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def chunk_id(c):
    """A step's chunk: an id (older files) or [id, tokens, score]."""
    return c if isinstance(c, str) else c[0]


def missed(rows):
    """Among the supporting paragraphs the loop missed: (sent in part, not
    sent, in part only by the first answer, of those a single chunk, of
    those the paragraph's first)."""
    part = none = first_only = single = lead = 0
    for r in rows:
        by = {}
        for step, s in enumerate(r["steps"]):
            for c in s["chunks"]:
                field, n = chunk_id(c).rsplit("#", 1)
                by.setdefault(field, []).append((step, n))
        for g in r["gold"]:
            if g["adaptive"]:
                continue
            sent = by.get(g["field"], [])
            if not sent:
                none += 1
                continue
            part += 1
            if all(step == 0 for step, _ in sent):
                first_only += 1
                if len(sent) == 1:
                    single += 1
                    lead += sent[0][1] == "0"
    return part, none, first_only, single, lead


def fill(rows):
    """The share of the follow-ups' budgets they sent."""
    sent = sum(s["sent_tokens"] for r in rows for s in r["steps"][1:])
    asked = sum(r["hop_tokens"] * (len(r["steps"]) - 1) for r in rows)
    return sent / asked if asked else 0.0


def all_kept(rows):
    return [int(r["adaptive_all_kept"]) for r in rows]


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
        kx, ky = all_kept(x), all_kept(y)
        folds = []
        for k in range(min(args.folds, len(kx))):
            idx = range(k, len(kx), args.folds)
            folds.append(sum(ky[i] - kx[i] for i in idx) / len(idx))
        gained = sum(1 for p, q in zip(kx, ky) if q > p)
        lost = sum(1 for p, q in zip(kx, ky) if p > q)
        print(
            f"first {budget:.2f}: all kept {sum(kx) / len(kx):.3f} -> {sum(ky) / len(ky):.3f}, "
            f"by fold {' '.join(f'{d:+.3f}' for d in folds)}; gained {gained}, lost {lost} of {len(kx)}; "
            "missed paragraphs (in part, not sent, in part only by the first answer, of those one chunk, "
            "of those #0) {} -> {}; follow-up budgets used {:.3f} -> {:.3f}".format(missed(x), missed(y), fill(x), fill(y))
        )


if __name__ == "__main__":
    main()
