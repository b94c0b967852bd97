"""Tests of models/fit_scorer.py: its packing mirrors the engine's (the
closure share, a header per piece, the title part's floor), its MuSiQue
count is by paragraph, and the fit moves a weight only where the
sets it was fitted on agree.

    .tools/venv/bin/python -m unittest discover -s models -p 'test_*.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import fit_scorer as F  # noqa: E402


def row(set_, id_, label, tokens, group, lead, header=0, **x):
    v = [0.0] * len(F.FEATURES)
    for k, val in x.items():
        v[F.FEATURES.index(k)] = val
    return {"set": set_, "id": id_, "label": label, "tokens": tokens, "x": v, "group": list(group),
            "lead": lead, "prose": True, "hand": 0.0, "field": group[0], "header": header}


class Packing(unittest.TestCase):
    def test_a_small_group_comes_whole_and_a_large_one_brings_its_lead(self):
        rows = [
            # a 3-sentence paragraph of 30 tokens: the best chunk brings the rest
            row("s", "a", 0, 10, (0, 0), True, dense_z=0.0),
            row("s", "a", 1, 10, (0, 0), False, dense_z=3.0),
            row("s", "a", 0, 10, (0, 0), False, dense_z=0.0),
            # a paragraph over the closure size: only its lead comes along
            row("s", "a", 0, 300, (1, 0), True, dense_z=-1.0),
            row("s", "a", 1, 150, (1, 0), False, dense_z=2.0),
        ] + [row("s", "a", 0, 40, (2 + k, 0), True, dense_z=-2.0) for k in range(10)]
        e = F.Example(rows, 1.0)
        chosen = e.pack(e.X @ F.HAND_W, 0.5)
        self.assertTrue({0, 1, 2} <= chosen, chosen)
        self.assertIn(4, chosen)
        self.assertNotIn(3, chosen, "the 300-token lead does not fit beside the rest")
        total = sum(int(e.cost[j]) for j in chosen)
        self.assertLessEqual(total, int(e.total * 0.5) + F.SEPARATOR)

    def test_a_paragraph_over_its_share_of_the_budget_brings_only_its_lead(self):
        # a 3-sentence paragraph of 33 tokens (with separators) in a
        # 100-token context: at a budget of 51 it is whole at share 1 and
        # 0.7 (35), not at 0.5 (25), where its last sentence is left
        rows = [
            row("s", "a", 0, 10, (0, 0), True, dense_z=0.0),
            row("s", "a", 1, 10, (0, 0), False, dense_z=3.0),
            row("s", "a", 0, 10, (0, 0), False, dense_z=-3.0),
        ] + [row("s", "a", 0, 7, (1 + k, 0), True, dense_z=-2.0) for k in range(10)]
        for share, whole in ((1.0, True), (0.7, True), (0.5, False)):
            e = F.Example(rows, share)
            chosen = e.pack(e.X @ F.HAND_W, 0.5)
            self.assertEqual(2 in chosen, whole, (share, chosen))
            self.assertTrue({0, 1} <= chosen, "the lead comes along either way")

    def test_each_piece_pays_its_header_once(self):
        # two fields of two sentences each, 10 tokens (11 with the
        # separator) and a 5-token header apiece: a run of adjacent chunks
        # pays its header once
        rows = [
            row("s", "a", 1, 10, (0, 0), True, header=5, dense_z=3.0),
            row("s", "a", 0, 10, (0, 1), True, header=5, dense_z=1.0),
            row("s", "a", 1, 10, (1, 0), True, header=5, dense_z=2.0),
            row("s", "a", 0, 10, (1, 1), True, header=5, dense_z=0.0),
        ]
        e = F.Example(rows, 1.0)
        self.assertEqual(e.price(1, {0}), 11, "next to a chosen chunk: no header")
        self.assertEqual(e.price(2, {0}), 16, "another field opens a piece")
        self.assertEqual(e.price(1, set()), 16)
        self.assertEqual(e.price(3, {2}), 11)
        # a paragraph's later sentence joins its piece after a gap: no header
        para = [row("s", "b", 0, 10, (0, 0), True, header=5)] + [row("s", "b", 0, 10, (0, 0), False, header=5)] * 2
        self.assertEqual(F.Example(para, 1.0).price(2, {0}), 11)
        chosen = e.pack(e.X @ F.HAND_W, 0.7)  # budget 29: 16 + 11, not 16 + 16
        self.assertEqual(chosen, {0, 1})

    def test_a_named_titles_part_is_floored_at_0(self):
        # the title part of a shared title weighs 3.84 - 2.77 * ln 6 < 0:
        # floored, the chunk keeps its dense score and beats the distractor
        w = F.HAND_W.copy()
        for k, v in (("link_title", 3.84), ("title_lead", 3.23), ("title_shared", -2.77)):
            w[F.FEATURES.index(k)] = v
        rows = [
            row("s", "a", 1, 10, (0, 0), False, dense_z=1.0, link_title=1.0, title_shared=float(np.log(6))),
            row("s", "a", 0, 10, (1, 0), False, dense_z=0.5),
        ] + [row("s", "a", 0, 30, (2 + k, 0), False, dense_z=-3.0) for k in range(2)]
        e = F.Example(rows, 1.0)
        # at a quarter (21 tokens) one chunk fits: the floored one, not the distractor
        self.assertEqual(e.recall(w), 1.0)

    def test_musique_counts_paragraphs_with_90_percent_of_their_tokens(self):
        rows = [
            row("musique", "m", 1, 50, (0, 0), True, dense_z=3.0),
            row("musique", "m", 1, 50, (0, 0), False, dense_z=-3.0),
            row("musique", "m", 1, 10, (1, 0), True, dense_z=2.0),
        ] + [row("musique", "m", 0, 30, (2 + k, 0), True, dense_z=0.0) for k in range(8)]
        e = F.Example(rows, 1.0)
        # both paragraphs whole: 2 of 2; the first half-sent: 1 of 2
        self.assertEqual(e.kept({0, 1, 2}), 1.0)
        self.assertEqual(e.kept({0, 2}), 0.5)


class Fitting(unittest.TestCase):
    def synthetic(self, sets, seed=0):
        """Per example, one evidence paragraph among distractors; the task
        names the evidence paragraph's title, but its dense score is
        below a distractor's (a bridge paragraph): only a stronger title
        link packs it."""
        rng = np.random.default_rng(seed)
        rows = []
        for s in sets:
            for n in range(30):
                i = f"{s}{n}"
                rows.append(row(s, i, 1, 20, (0, 0), True, dense_z=0.2, link_title=1.0, title_lead=1.0))
                rows.append(row(s, i, 0, 20, (1, 0), True, dense_z=3.5 + rng.random()))
                for k in range(4):
                    rows.append(row(s, i, 0, 20, (2 + k, 0), True, dense_z=float(rng.normal(0, 0.5))))
        return rows

    def test_the_fit_lifts_a_link_every_set_needs_and_cross_validation_reports_it(self):
        with tempfile.TemporaryDirectory() as d:
            dump = os.path.join(d, "dump.jsonl")
            with open(dump, "w") as f:
                for r in self.synthetic(["a", "b", "c"]):
                    f.write(json.dumps(r) + "\n")
            out, report = os.path.join(d, "scorer.json"), os.path.join(d, "cv.json")
            subprocess.run([sys.executable, F.__file__, dump, "--out", out, "--report", report, "--folds", "3",
                            "--lambdas", "0"], check=True, capture_output=True)
            with open(out) as f:
                w = json.load(f)
            with open(report) as f:
                rep = json.load(f)
        self.assertEqual(w["features"], F.FEATURES)
        weight = dict(zip(w["features"], w["weights"]))
        self.assertGreater(weight["link_title"] + weight["title_lead"], 3.0 + 0.5, weight)
        self.assertEqual(weight["dense_z"], 1.0)
        for k in ("link_defined", "link_mention", "link_owner"):
            self.assertEqual(weight[k], F.HAND[k], "no train set has code: its links keep the hand weights")
        # held out, each set gains over the hand sum (which packs the distractor at 1/3 and 1/4)
        chosen = rep["loso"][f"{rep['chosen']['free']} lambda=0.0"]["per_set"]
        for s, v in chosen.items():
            self.assertGreater(v, rep["hand_per_set"][s], s)
        self.assertEqual(len(rep["kfold"]), 3)
        self.assertIn(rep["chosen"]["free"], F.SHIPPABLE)

    def test_old_dumps_are_refused_by_name(self):
        with tempfile.TemporaryDirectory() as d:
            dump = os.path.join(d, "old.jsonl")
            with open(dump, "w") as f:
                f.write(json.dumps({"set": "a", "id": "1", "label": 1, "tokens": 3, "x": [0.0] * 17}) + "\n")
            r = subprocess.run([sys.executable, F.__file__, dump, "--out", os.path.join(d, "o.json")],
                               capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no group, lead, prose", r.stderr)


if __name__ == "__main__":
    unittest.main()
