"""Fits the learned scorer: a linear scorer over the per-chunk features
`scd-dev eval --dump-features` writes (one JSON line per chunk: set, id, label,
tokens, x, the chunk's group, lead and prose flags, its field, the header
tokens of a piece it opens, and the hand sum's score), on the datasets'
train samples.

What is fitted is what packing does with the scores. For each example the
script packs its chunks as the engine does (greedy by score under a budget
of a third and a quarter of the example's tokens; a prose group brought
whole when it costs at most `group_closure_tokens` and `--closure-share` of
the budget, else its lead; each piece paying its header line, with pieces as
the text renders them (a run of adjacent chunks of one field, or of one
paragraph: stricter, the engine's packer joins only adjacent chunks, and its
render and refill then merge a paragraph's pieces); a named title's part of
the score floored at 0) and counts the evidence that lands, as `scd-dev
eval` does: evidence chunks, and for MuSiQue paragraphs of which 90 % of the
tokens land. The weights start at the hand-weighted sum's and move by
coordinate ascent on that packed recall, averaged over the sets so that no
set outweighs another, less a penalty on the distance from the hand sum (in
units of each feature's spread). The penalty's strength is chosen by
leave-one-set-out cross-validation (fit on two sets, judge on the third, for
each), and the result is checked by k folds grouped by example.

A softmax over each example's chunks (the first round) fitted the
features well and packed worse: it spread the selection over more
paragraphs, whose leads closure then brought, and lost SQuAD. Fitting
the packed recall itself is what the engine is judged by.

Which weights may move is chosen with the penalty, by the same
leave-one-set-out, among nested candidates (`FREE_SETS`: the title links
only, then the other signals; the second hop's weight, the chunk's place
and the raw cosine are fitted and reported but never chosen, since the
engine ships only scores that add up from an explanation's parts, with the
hop at its setting's weight, which `scd serve` exposes). A set the model
never saw is what matters, and weights that help the sets they were
fitted on can hurt the one held out. The code links (`link_defined`,
`link_mention`, `link_owner`) never move (no train set has code), nor does
`dense_z`, which sets the scale. The final model is fitted on
every row and written as the engine's `scorer.json`; the report (folds
included, and the judged dumps, e.g. the dev halves, which are never
fitted on) goes to stdout and, with --report, to a JSON file.

    .tools/venv/bin/python models/fit_scorer.py train_*.jsonl --judge dev_*.jsonl \
        --shipped engine/src/extract/scorer.json \
        --out scorer.json --report benches/results/scorer_cv.json
"""

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

FEATURES = [
    "dense_z", "dense", "lexical_z", "group_best", "link_title", "link_defined", "link_mention",
    "link_owner", "hop_z", "hop_on", "lead", "position", "group_size", "group_rank", "dense_rank", "tokens",
    "title_lead", "title_shared",
]

# the hand-weighted sum's weights over the same features (its defaults:
# lexical 0.3, field 0.5, link 2.0, lead link bonus 1.5, owner link 1.0,
# second hop 0.5); `title_lead` is link_title x lead
HAND = {"dense_z": 1.0, "lexical_z": 0.3, "group_best": 0.5, "link_title": 2.0, "title_lead": 1.0,
        "link_defined": 3.0, "link_mention": 2.0, "link_owner": 1.0, "hop_z": 0.5}

# which weights the search may move: each a candidate, chosen with lambda
# by leave-one-set-out (the code links and `dense_z`, the scale, never move)
FREE_SETS = {
    "links": ["link_title", "title_lead", "title_shared"],
    "signals": ["lexical_z", "group_best", "link_title", "title_lead", "title_shared"],
    "links+hop": ["link_title", "title_lead", "title_shared", "hop_z"],
    "place": ["lexical_z", "group_best", "link_title", "title_lead", "title_shared", "hop_z", "dense", "lead",
              "position", "group_size", "group_rank", "dense_rank", "tokens"],
}
# what the engine ships: a score that adds up from an explanation's parts,
# with the second hop at its setting's weight (features.rs, WEIGHABLE);
# "links+hop" and "place" are fitted and reported, never chosen
SHIPPABLE = {"links", "signals"}

# the engine's packing: budgets as fractions of an example's tokens, each
# chunk paying one separator, prose groups up to this many tokens whole
# (and, below a share of 1, up to --closure-share of the budget: the
# engine's group_closure_share, issue 45)
FRACTIONS = (1 / 3, 1 / 4)
SEPARATOR = 1
GROUP_CLOSURE_TOKENS = 400
CLOSURE_SHARE = 0.4
# the parts of a named title, whose sum the engine floors at 0 (features.rs)
TITLE = ("link_title", "title_lead", "title_shared")


class Example:
    """One example's chunks, and its packing."""

    def __init__(self, rows, share):
        self.set = rows[0]["set"]
        self.share = share
        self.id = rows[0]["id"]
        self.X = np.asarray([r["x"] for r in rows], dtype=np.float64)
        self.y = np.asarray([r["label"] for r in rows], dtype=np.float64)
        self.gold = self.y.sum()
        tokens = np.asarray([r["tokens"] for r in rows])
        # MuSiQue is judged by paragraphs (one counts when 90 % of it is
        # sent), the other sets by evidence chunks
        self.paragraphs = None
        if self.set == "musique":
            by = defaultdict(list)
            for j, r in enumerate(rows):
                if r["label"]:
                    by[tuple(r["group"])].append(j)
            self.paragraphs = [(m, tokens[m].sum()) for m in by.values()]
        self.total = int(tokens.sum())
        self.cost = tokens + SEPARATOR
        group = [tuple(r["group"]) for r in rows]
        members = defaultdict(list)
        for j, g in enumerate(group):
            members[g].append(j)
        leads = {group[j]: j for j, r in enumerate(rows) if r["lead"]}
        size = {g: int(self.cost[m].sum()) for g, m in members.items()}
        # each chunk's group: what closure brings whole (a prose group within
        # the limit), and what a piece may span (below)
        self.group = [members[g] for g in group]
        self.prose = [r["prose"] for r in rows]
        self.size = [size[g] for g in group]
        self.lead = [leads.get(g) for g in group]
        # a piece is a run of adjacent chunks of one field (rows come in the
        # engine's chunk order) or of one group (a paragraph's later
        # sentence joins it after a gap line); the chunk that opens one
        # pays its header
        field = [r["field"] for r in rows]
        self.header = [r["header"] for r in rows]
        self.prev = [j - 1 if j and field[j - 1] == field[j] else None for j in range(len(rows))]
        self.next = [j + 1 if j + 1 < len(rows) and field[j + 1] == field[j] else None for j in range(len(rows))]

    def price(self, i, chosen):
        """What `i` costs beside `chosen`: its tokens, and a header when
        nothing chosen is next to it or in its group (joining two pieces
        refunds nothing; a gap line is not counted)."""
        alone = self.prev[i] not in chosen and self.next[i] not in chosen and chosen.isdisjoint(self.group[i])
        return self.cost[i] + (self.header[i] if alone else 0)

    def pack(self, scores, fraction):
        """The chunks packing takes (greedy by score; closure as the engine's)."""
        budget = int(self.total * fraction) + SEPARATOR
        limit = GROUP_CLOSURE_TOKENS if self.share >= 1 else min(GROUP_CLOSURE_TOKENS, int(max(self.share, 0) * budget))
        chosen, used = set(), 0
        for i in np.argsort(-scores, kind="stable"):
            price = self.price(i, chosen)
            if i in chosen or used + price > budget:
                continue
            used += price
            chosen.add(i)
            if self.prose[i] and self.size[i] <= limit:
                rest, extra, taken = [j for j in self.group[i] if j not in chosen], 0, set(chosen)
                for j in rest:
                    extra += self.price(j, taken)
                    taken.add(j)
                if rest and used + extra <= budget:
                    chosen.update(rest)
                    used += extra
                    continue
            lead = self.lead[i]
            price = None if lead is None or lead in chosen else self.price(lead, chosen)
            if price is not None and used + price <= budget:
                used += price
                chosen.add(lead)
        return chosen

    def recall(self, w):
        """Evidence recall, averaged over the budgets."""
        title = self.X[:, TITLE_AT] @ w[TITLE_AT]
        s = self.X @ w - title + np.maximum(title, 0.0)
        return float(np.mean([self.kept(self.pack(s, f)) for f in FRACTIONS]))

    def kept(self, chosen):
        if self.paragraphs is None:
            return sum(self.y[j] for j in chosen) / self.gold
        tok = self.cost - SEPARATOR
        return float(np.mean([sum(tok[j] for j in m if j in chosen) >= 0.9 * t for m, t in self.paragraphs]))


def load(paths, share):
    rows = defaultdict(list)
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                r = json.loads(line)
                keys = ("set", "id", "label", "tokens", "x", "group", "lead", "prose", "field", "header")
                missing = [k for k in keys if k not in r]
                if missing:
                    sys.exit(f"{p}:{n}: no {', '.join(missing)} (dumped by an older scd-dev eval --dump-features)")
                if len(r["x"]) != len(FEATURES):
                    sys.exit(f"{p}:{n}: {len(r['x'])} features; this script knows {len(FEATURES)}")
                rows[(r["set"], r["id"])].append(r)
    return [Example(r, share) for r in rows.values() if sum(x["label"] for x in r) > 0]


def per_set(examples, w):
    by = defaultdict(list)
    for e in examples:
        by[e.set].append(e.recall(w))
    return {k: round(float(np.mean(v)), 5) for k, v in sorted(by.items())}


def mean_over_sets(examples, w):
    return float(np.mean(list(per_set(examples, w).values())))


HAND_W = np.array([HAND.get(n, 0.0) for n in FEATURES])
TITLE_AT = [FEATURES.index(n) for n in TITLE]


def shipped_weights(path):
    """A scorer.json's weights as the engine scores with them: the second
    hop at the hand sum's weight, as the fit holds it."""
    with open(path) as fh:
        s = json.load(fh)
    if s["features"] != FEATURES:
        sys.exit(f"{path}: fitted on other features")
    w = np.asarray(s["weights"], dtype=np.float64)
    w[FEATURES.index("hop_z")] = s.get("second_hop_weight_in_fit", HAND["hop_z"])
    return w


def fit(examples, free, lam, rounds=4, eps=5e-4):
    """Coordinate ascent over the `free` weights on packed recall less lam
    x the squared distance from the hand sum (in units of each feature's
    spread); steps of a quarter spread, halved each round."""
    spread = np.vstack([e.X for e in examples]).std(0)
    spread[spread < 1e-6] = 1.0

    def objective(w):
        return mean_over_sets(examples, w) - lam * float((((w - HAND_W) * spread) ** 2).sum())

    w = HAND_W.copy()
    best = objective(w)
    step = 0.25 / spread
    for _ in range(rounds):
        moved = False
        for name in free:
            k = FEATURES.index(name)
            tries = []
            for d in (-2, -1, 1, 2):
                v = w.copy()
                v[k] += d * step[k]
                tries.append((objective(v), d, v))
            o, _, v = max(tries, key=lambda t: t[0])
            if o > best + eps:
                best, w, moved = o, v, True
        if not moved:
            break
        step = step / 2
    return w


def choose(train, names, candidates, lambdas, report):
    """Leave one set out: which weights move, and lambda, by mean held-out
    packed recall (ties: the fewer free weights, the stronger pull)."""
    unknown = [c for c in candidates if c not in FREE_SETS]
    if unknown or not SHIPPABLE & set(candidates):
        sys.exit(f"--candidates: {unknown or candidates}: expected some of {', '.join(FREE_SETS)}, one shippable")
    best = None
    for free_name, free in ((c, FREE_SETS[c]) for c in candidates):
        for lam in sorted((float(v) for v in lambdas.split(",")), reverse=True):
            per = {}
            for held in names:
                w = fit([e for e in train if e.set != held], free, lam)
                per[held] = per_set([e for e in train if e.set == held], w)[held]
            mean = round(float(np.mean(list(per.values()))), 5)
            report["loso"][f"{free_name} lambda={lam}"] = {"free": free, "lambda": lam, "per_set": per, "mean": mean}
            print(f"leave-one-set-out, {free_name}, lambda={lam}: {per}; mean {mean}", flush=True)
            if free_name in SHIPPABLE and (best is None or mean > best[2]):
                best = (free_name, lam, mean)
    free_name, lam, _ = best
    print(f"chosen: {free_name} ({', '.join(FREE_SETS[free_name])}), lambda {lam}")
    return free_name, lam


def kfold(train, free, lam, folds, shipped_w, report):
    """k folds grouped by example, at the chosen weights and lambda, beside
    the hand sum and (when given) the shipped weights."""
    rng = np.random.default_rng(27)
    order = rng.permutation(len(train))
    fold = np.empty(len(train), dtype=int)
    fold[order] = np.arange(len(train)) % folds
    for k in range(folds):
        w = fit([e for e, f in zip(train, fold) if f != k], free, lam)
        held = [e for e, f in zip(train, fold) if f == k]
        r = {"examples": len(held), "learned": per_set(held, w), "hand": per_set(held, HAND_W)}
        if shipped_w is not None:
            r["shipped"] = per_set(held, shipped_w)
        for name in ("learned", "hand", "shipped"):
            if name in r:
                r[f"{name}_mean"] = round(float(np.mean(list(r[name].values()))), 5)
        report["kfold"].append(r)
        line = "; ".join(f"{n} {r[n]} mean {r[n + '_mean']}" for n in ("learned", "hand", "shipped") if n in r)
        print(f"fold {k} ({r['examples']} examples): {line}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="+", help="train dumps: what is fitted on")
    ap.add_argument("--judge", nargs="*", default=[], help="dumps only judged (e.g. the dev halves), never fitted on")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--lambdas", default="0,0.01,0.03")
    ap.add_argument("--closure-share", type=float, default=CLOSURE_SHARE,
                    help="the engine's group_closure_share the packing models (1: no share)")
    ap.add_argument("--candidates", default=",".join(FREE_SETS),
                    help=f"which of {', '.join(FREE_SETS)} to fit (those not shippable are only reported)")
    ap.add_argument("--shipped", help="a scorer.json (e.g. the engine's) judged beside the hand sum, never fitted")
    args = ap.parse_args()
    train = load(args.dumps, args.closure_share)
    judged = load(args.judge, args.closure_share) if args.judge else []
    shipped_w = shipped_weights(args.shipped) if args.shipped else None
    names = sorted({e.set for e in train})
    if len(names) < 2:
        sys.exit(f"leave-one-set-out needs two sets or more; the dumps hold {names}")
    counts = {n: sum(e.set == n for e in train) for n in names}
    print(f"{sum(len(e.y) for e in train)} chunks of {len(train)} examples with evidence: {counts}")
    hand = per_set(train, HAND_W)
    report = {"features": FEATURES, "fractions": FRACTIONS, "examples": counts, "hand_per_set": hand,
              "hand_mean": round(float(np.mean(list(hand.values()))), 5), "loso": {}, "kfold": []}
    print(f"hand sum, packed recall on each set: {hand}; mean {report['hand_mean']}")
    report["closure_share"] = args.closure_share
    if shipped_w is not None:
        report["shipped_per_set"] = per_set(train, shipped_w)
        print(f"{args.shipped}, packed recall on each set: {report['shipped_per_set']}; "
              f"mean {np.mean(list(report['shipped_per_set'].values())):.5f}")

    free_name, lam = choose(train, names, args.candidates.split(","), args.lambdas, report)
    free = FREE_SETS[free_name]
    kfold(train, free, lam, args.folds, shipped_w, report)

    w = fit(train, free, lam)
    report["chosen"] = {"free": free_name, "weights": free, "lambda": lam}
    report["weights"] = {n: round(float(v), 6) for n, v in zip(FEATURES, w)}
    report["train_per_set"] = per_set(train, w)
    print(f"chosen lambda {lam}; packed recall on train {report['train_per_set']}")
    print("weights: " + ", ".join(f"{n} {v:+.3f}" for n, v in report["weights"].items()))
    if judged:
        report["judged"] = {"hand": per_set(judged, HAND_W), "learned": per_set(judged, w)}
        if shipped_w is not None:
            report["judged"]["shipped"] = per_set(judged, shipped_w)
        print("judged (never fitted on): " + "; ".join(f"{k} {v}" for k, v in report["judged"].items()))
    # the engine adds the second hop at its setting's weight (the hand
    # sum's, which the fit held): the shipped weights leave it out
    shipped = w.copy()
    shipped[FEATURES.index("hop_z")] = 0.0
    out = {
        "features": FEATURES,
        "mean": [0.0] * len(FEATURES),
        "std": [1.0] * len(FEATURES),
        "weights": [round(float(v), 6) for v in shipped],
        "second_hop_weight_in_fit": HAND["hop_z"],
        "bias": 0.0,
        "free": free,
        "lambda": lam,
        "closure_share_in_fit": args.closure_share,
        "fitted_on": counts,
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"wrote {args.out}")
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
