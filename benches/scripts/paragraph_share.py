"""How much of a 3x budget one supporting paragraph costs, per Wikipedia train
sample: the quantiles of (paragraph words x 1.35) / (0.33 x context words x
1.35), a rough token count, over every supporting paragraph of the first 200
questions. It shows one way the sets differ where `group_closure_share`
(issue 45, BENCHMARKS.md) treats them differently: where a supporting
paragraph is a large share of the budget, sending it whole costs room
another paragraph's fact could have had.

    python3 benches/scripts/paragraph_share.py [SHARED_DIR]
"""

import json
import sys
from pathlib import Path


def tokens(text):
    return len(text.split()) * 1.35


def examples(evaldata, name):
    """Each question's paragraphs as (text, supporting) pairs."""
    if name == "musique":
        lines = (evaldata / "musique/musique_ans_train_sample.jsonl").read_text().splitlines()[:200]
        for line in lines:
            d = json.loads(line)
            yield [(p["paragraph_text"], p["is_supporting"]) for p in d["paragraphs"]]
        return
    path = {"2wiki": "2wikimultihopqa/2wiki_train_sample.json", "hotpotqa": "hotpotqa/hotpot_train_sample.json"}[name]
    for d in json.loads((evaldata / path).read_text())[:200]:
        sup = {title for title, _ in d["supporting_facts"]}
        yield [(" ".join(sents), title in sup) for title, sents in d["context"]]


def main():
    evaldata = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared") / "evaldata"
    qs = [0.1, 0.25, 0.5, 0.75, 0.9]
    print("set       supporting paragraphs   share of a 3x budget at quantiles " + " ".join(f"{q:.2f}" for q in qs))
    for name in ["2wiki", "hotpotqa", "musique"]:
        shares = []
        for paragraphs in examples(evaldata, name):
            budget = 0.33 * sum(tokens(p) for p, _ in paragraphs)
            shares += [tokens(p) / budget for p, s in paragraphs if s]
        shares.sort()
        at = " ".join(f"{shares[int(q * len(shares))]:.2f}" for q in qs)
        print(f"{name:9} {len(shares):22}   {at}")


if __name__ == "__main__":
    main()
