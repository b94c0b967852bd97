#!/usr/bin/env python3
"""Training groups for the reranker, and the train questions kept out of
training for choosing its weight (models/rerank/SOURCE.md says what each is).

Sources (never a development half that BENCHMARKS.md reports on):
* ``../shared/evaldata``'s train-split samples of HotpotQA, 2WikiMultihopQA
  and MuSiQue: question → supporting sentence (paragraph for MuSiQue);
* the crates a–l of this workspace's ``Cargo.lock`` as cargo unpacks them,
  less every crate the code-search development set draws from (by name, any
  version): a public function's first ``///`` sentence → the function.

Each question or crate lands in one of five folds by a hash of its id; fold 0
is kept out of training and written in its set's own schema
(``heldout/``), so ``scd-dev tune`` can choose the reranker's weight on
questions the model never saw. Everything is seeded: the same inputs give
the same files, byte for byte.

Usage: build_pairs.py --evaldata ../shared/evaldata --registry ~/.cargo/registry/src/<index> --out DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path

NEGATIVES = 5
GROUPS_PER_QUESTION = 1
PAIRS_PER_CRATE = 12
FOLDS = 5
ROOT = Path(__file__).resolve().parents[2]
# groups of the held-out fold: scored before and after training (train.py)
held_groups: list[dict] = []
# the held-out sets' projects (issue #45) and their packages: never trained on
HELD_OUT_CRATES = {"grep", "grep-cli", "grep-matcher", "grep-pcre2", "grep-printer", "grep-regex", "grep-searcher",
                   "globset", "ignore", "bat", "fd-find", "just", "starship", "cargo", "cargo-util", "cargo-platform",
                   "crates-io", "uv", "reqwest"}


def fold(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % FOLDS


def group(rng: random.Random, s: str, q: str, pos: str, near: list[str], far: list[str]) -> dict | None:
    """One positive and NEGATIVES negatives, up to 3 of them from ``near``
    (the gold's own paragraph or file)."""
    near = [p for p in near if p != pos]
    far = [p for p in far if p != pos]
    negs = rng.sample(near, min(3, len(near)))
    negs += rng.sample(far, min(NEGATIVES - len(negs), len(far)))
    if len(negs) < NEGATIVES:
        return None
    return {"set": s, "query": q, "pos": pos, "negs": negs}


def wiki_groups(rng: random.Random, s: str, records: list[dict]) -> tuple[list[dict], list[dict]]:
    """HotpotQA / 2Wiki (``context: [[title, sentences]]``)."""
    train, held = [], []
    for r in records:
        out = train
        if fold(s + r["_id"]) == 0:
            held.append(r)
            out = held_groups
        sents = {(t, i): f"{t}\n{x.strip()}" for t, xs in r["context"] for i, x in enumerate(xs) if x.strip()}
        gold = [sents[(t, i)] for t, i in r["supporting_facts"] if (t, i) in sents]
        gold_titles = {t for t, _ in r["supporting_facts"]}
        for pos in rng.sample(gold, min(GROUPS_PER_QUESTION, len(gold))):
            near = [v for (t, _), v in sents.items() if t in gold_titles and v not in gold]
            far = [v for (t, _), v in sents.items() if t not in gold_titles]
            g = group(rng, s, r["question"], pos, near, far)
            if g:
                out.append(g)
    return train, held


def musique_groups(rng: random.Random, lines: list[str]) -> tuple[list[dict], list[str]]:
    train, held = [], []
    for line in lines:
        r = json.loads(line)
        out = train
        if fold("musique" + r["id"]) == 0:
            held.append(line)
            out = held_groups
        paras = [(p["is_supporting"], f"{p['title']}\n{p['paragraph_text'].strip()}") for p in r["paragraphs"]]
        gold = [t for sup, t in paras if sup]
        rest = [t for sup, t in paras if not sup]
        for pos in rng.sample(gold, min(GROUPS_PER_QUESTION, len(gold))):
            g = group(rng, "musique", r["question"], pos, [], rest)
            if g:
                out.append(g)
    return train, held


DOC = re.compile(r"^\s*///(?!/)\s?(.*)$")
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+\w+")


def first_sentence(doc: list[str]) -> str | None:
    words = []
    for d in doc:
        if not d.strip() or d.lstrip().startswith(("#", "```")):
            break
        words.append(d.strip())
    text = re.sub(r"\[`?([^\]`]+)`?\](\([^)]*\)|\[[^\]]*\])?", r"\1", " ".join(words)).replace("`", "")
    text = re.split(r"(?<=[.!?])\s", text)[0].strip().rstrip(".")
    return text if 4 <= len(text.split()) <= 40 else None


def functions(path: str, src: str) -> list[dict]:
    """Documented functions of 3–60 lines: their first doc sentence, their
    text (signature and body, no doc comment) and line span."""
    lines = src.split("\n")
    out, i = [], 0
    while i < len(lines):
        doc = []
        while i < len(lines) and DOC.match(lines[i]):
            doc.append(DOC.match(lines[i]).group(1))
            i += 1
        while doc and i < len(lines) and lines[i].lstrip().startswith("#["):
            i += 1
        if doc and i < len(lines) and FN.match(lines[i]):
            depth, j, opened = 0, i, False
            while j < len(lines) and j - i < 80:
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if (opened and depth <= 0) or (not opened and lines[j].rstrip().endswith(";")):
                    break
                j += 1
            task = first_sentence(doc)
            if task and opened and depth <= 0 and 3 <= j - i + 1 <= 60:
                out.append({"task": task, "text": "\n".join(lines[i: j + 1]), "path": path})
            i = j + 1 if doc else i + 1
        elif not doc:
            i += 1
    return out


def dev_crate_names(evaldata: Path) -> set[str]:
    names = set()
    for line in open(evaldata / "code" / "code_search_dev.jsonl"):
        names.add(re.sub(r"-\d[\w.+-]*$", "", json.loads(line)["crate"]))
    return names


def lock_crates(registry: Path, excluded: set[str]) -> list[Path]:
    lock = (ROOT / "Cargo.lock").read_text()
    found = []
    for name, ver in re.findall(r'name = "([^"]+)"\nversion = "([^"]+)"\nsource = "registry', lock):
        if name[0] <= "l" and name not in excluded and name not in HELD_OUT_CRATES:
            d = registry / f"{name}-{ver}"
            if not d.is_dir():
                raise SystemExit(f"{d} is missing: run `cargo fetch` first")
            found.append(d)
    return sorted(found)


def code_groups(rng: random.Random, crates: list[Path]) -> tuple[list[dict], list[dict]]:
    train, held = [], []
    for crate in crates:
        fns, files = [], {}
        for f in sorted(crate.rglob("*.rs")):
            rel = f.relative_to(crate.parent).as_posix()
            if any(p in rel.split("/") for p in ("tests", "benches", "examples", "target")):
                continue
            src = f.read_text(errors="replace").replace("\r\n", "\n")
            files[rel] = src
            fns += functions(rel, src)
        seen, uniq = set(), []
        for fn in fns:
            if fn["task"] not in seen:
                seen.add(fn["task"])
                uniq.append(fn)
        if len(uniq) < NEGATIVES + 1:
            continue
        picks = rng.sample(uniq, min(PAIRS_PER_CRATE, len(uniq)))
        out = train
        if fold(crate.name) == 0:
            held += [heldout_case(crate.name, fn, files[fn["path"]]) for fn in picks[:6]]
            out = held_groups
        for fn in picks:
            pool = [f"{o['path']}\n{o['text']}" for o in uniq if o is not fn]
            near = [f"{o['path']}\n{o['text']}" for o in uniq if o is not fn and o["path"] == fn["path"]]
            g = group(rng, "code", fn["task"], f"{fn['path']}\n{fn['text']}", near, pool)
            if g:
                out.append(g)
    return train, [h for h in held if h]


def heldout_case(crate: str, fn: dict, src: str) -> dict | None:
    """A code-search case in the development set's schema (its SOURCE.md):
    the whole file without the function's doc comment."""
    lines = src.split("\n")
    if not 120 <= len(lines) <= 1500:
        return None
    start = src.find(fn["text"])
    if start < 0:
        return None
    head = src[:start].split("\n")
    k = len(head) - 1
    while k > 0 and (DOC.match(head[k - 1]) or head[k - 1].lstrip().startswith("#[")):
        k -= 1
    content = "\n".join(head[:k] + [ln for ln in head[k:] if not DOC.match(ln)]) + src[start:]
    return {"id": f"{fn['path']}::{fn['task'][:40]}", "crate": crate, "task": fn["task"], "gold": fn["text"],
            "context": {"fields": [{"name": fn["path"], "kind": "code", "content": content, "confidential": False}]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evaldata", type=Path, default=ROOT.parent / "shared" / "evaldata")
    ap.add_argument("--registry", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rng = random.Random(45)
    ev = a.evaldata
    hot, hot_held = wiki_groups(rng, "hotpot", json.load(open(ev / "hotpotqa" / "hotpot_train_sample.json")))
    two, two_held = wiki_groups(rng, "2wiki", json.load(open(ev / "2wikimultihopqa" / "2wiki_train_sample.json")))
    mus, mus_held = musique_groups(rng, open(ev / "musique" / "musique_ans_train_sample.jsonl").read().splitlines())
    crates = lock_crates(a.registry, dev_crate_names(ev))
    code, code_held = code_groups(rng, crates)
    groups = hot + two + mus + code
    rng.shuffle(groups)
    held_dir = a.out / "heldout"
    held_dir.mkdir(parents=True, exist_ok=True)
    (held_dir / "hotpot.json").write_text(json.dumps(hot_held))
    (held_dir / "2wiki.json").write_text(json.dumps(two_held))
    (held_dir / "musique.jsonl").write_text("".join(line + "\n" for line in mus_held))
    (held_dir / "code.jsonl").write_text("".join(json.dumps(c) + "\n" for c in code_held))
    for name, gs in (("groups.jsonl", groups), ("heldout_groups.jsonl", held_groups)):
        with open(a.out / name, "w") as f:
            for g in gs:
                f.write(json.dumps(g, ensure_ascii=False) + "\n")
    summary = {
        "groups": {s: sum(g["set"] == s for g in groups) for s in ("hotpot", "2wiki", "musique", "code")},
        "heldout_groups": len(held_groups),
        "heldout": {"hotpot": len(hot_held), "2wiki": len(two_held), "musique": len(mus_held),
                    "code": len(code_held)},
        "crates": [c.name for c in crates],
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "crates"}), f"{len(crates)} crates")


if __name__ == "__main__":
    main()
