"""Chooses a follow-up floor per kind of agent material by cross-validation
over one `scd-dev eval --dataset agent --adaptive --sweep
more_min_relevance=-1,F,... --per-example F.jsonl` run (-1 is the floor
off; the run's `scd` lines, the manifest's floors, are left out, and the
model's floor is named by --model-floor).

A case's on-topic score is the gold it has after its follow-ups: the mean
of `with_follow_up_kept` (its own task asked again) and, where another case
has the same context, `second_kept` (that case's task asked as a follow-up,
scored by that case's gold). The rule, as `floor_cv.py`'s for MuSiQue: per
kind, the highest floor whose mean on-topic score equals the floor off's.
Folds are grouped by context: cases that share one (each asks another's
task as its second question) are in one fold, the i-th distinct context of
a kind in fold i mod k. For each fold the floor is chosen by the rule on
the other folds and the held fold is reported at it: the on-topic score
beside the floor off's and the model's, and the share of off-topic
follow-ups (another kind's task) that got nothing. Then the rule on all
folds.

    python3 benches/scripts/floor_by_kind_cv.py F.jsonl[.gz] --model-floor 0.8 [--folds 5] [--json OUT.json]
"""

import argparse
import gzip
import json
import re


def load(path):
    """kind -> case ids in order, (floor, case id) -> (on-topic, off-topic
    empty), and the pairs of cases that share a context (a case and its
    second question's)."""
    kinds, scores, pairs = {}, {}, set()
    opener = gzip.open if path.endswith(".gz") else open
    for line in opener(path, "rt"):
        p = json.loads(line)
        if p["method"] == "scd":
            continue
        m = re.fullmatch(r"scd\[more_min_relevance=(-?[0-9.]+)\]", p["method"])
        if not m:
            raise SystemExit(f"{path}: method {p['method']!r} is not a floor")
        floor = float(m.group(1))
        ids = kinds.setdefault(p["kind"], [])
        if p["id"] not in ids:
            ids.append(p["id"])
        if "second_id" in p:
            pairs.add((p["id"], p["second_id"]))
        on = [p["with_follow_up_kept"]] + ([p["second_kept"]] if "second_kept" in p else [])
        scores[(floor, p["id"])] = (sum(on) / len(on), float(p["off_topic_tokens"] == 0))
    return kinds, scores, pairs


def folds_by_context(ids, pairs, k):
    """case id -> fold: cases linked by `pairs` (transitively) share one
    context and one fold, the i-th context of `ids` (by first case) in i mod k."""
    root = {i: i for i in ids}

    def find(i):
        while root[i] != i:
            i = root[i]
        return i

    for a, b in pairs:
        if a in root and b in root:
            root[find(b)] = find(a)
    contexts = []
    for i in ids:
        if find(i) not in contexts:
            contexts.append(find(i))
    return {i: contexts.index(find(i)) % k for i in ids}


def mean(scores, floor, ids, side):
    return sum(scores[(floor, i)][side] for i in ids) / len(ids)


def choose(scores, floors, ids):
    """The highest floor whose on-topic score on `ids` equals the floor off's."""
    # the reports hold f32s: a difference under a thousandth of a case is none
    off = mean(scores, -1.0, ids, 0)
    return max(f for f in floors if mean(scores, f, ids, 0) >= off - 1e-4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("per_example")
    ap.add_argument("--model-floor", type=float, required=True, help="the model's floor, one of the run's")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    kinds, scores, pairs = load(args.per_example)
    floors = sorted({f for f, _ in scores})
    if -1.0 not in floors:
        raise SystemExit("no run with the floor off (more_min_relevance=-1)")
    k, d = args.folds, args.model_floor
    if d not in floors:
        raise SystemExit(f"--model-floor {d}: the run has no more_min_relevance={d}")
    out = {"floors": floors, "folds": k, "model_floor": d, "kinds": {}}
    print(f"floors {floors}; {k} folds; on = gold after the follow-ups, off = off-topic follow-ups that got nothing")
    print("kind  fold cases chosen   on (off / model)        off-topic empty (off / model)")
    for kind, ids in kinds.items():
        fold = folds_by_context(ids, pairs, k)
        rows = []
        for f in range(k):
            held = [i for i in ids if fold[i] == f]
            train = [i for i in ids if fold[i] != f]
            c = choose(scores, floors, train)
            row = {"fold": f, "cases": len(held), "chosen": c}
            for name, fl in (("chosen", c), ("floor_off", -1.0), ("model", d)):
                row[f"on_{name}"] = mean(scores, fl, held, 0)
                row[f"off_empty_{name}"] = mean(scores, fl, held, 1)
            rows.append(row)
            print(
                f"{kind:<5} {f:>4} {len(held):>5} {c:>6}   {row['on_chosen']:.3f} ({row['on_floor_off']:.3f} / "
                f"{row['on_model']:.3f})    {row['off_empty_chosen']:.3f} ({row['off_empty_floor_off']:.3f} / "
                f"{row['off_empty_model']:.3f})"
            )
        n = len(ids)
        # held-out means weigh each fold by its cases
        held = {key: sum(r[key] * r["cases"] for r in rows) / n for key in rows[0] if key.startswith(("on_", "off_"))}
        chosen = choose(scores, floors, ids)
        print(
            f"{kind:<5} held out: on {held['on_chosen']:.3f} (floor off {held['on_floor_off']:.3f}, model "
            f"{held['on_model']:.3f}); off-topic empty {held['off_empty_chosen']:.3f} (floor off "
            f"{held['off_empty_floor_off']:.3f}, model {held['off_empty_model']:.3f}); on all folds: {chosen}"
        )
        out["kinds"][kind] = {"cases": n, "folds": rows, "held_out": held, "chosen_on_all": chosen}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
