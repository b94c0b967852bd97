#!/usr/bin/env python3
"""Prepare what the GPU machine needs (run here, in the models venv).

Writes under ``--out`` (default ``.gpu/stage``):

* ``models/e5-small-fp16-check/``  e5-small-fp16 with every word-embedding row
  that the check texts never use set to zero: identical outputs on those
  texts, and the file compresses from 235 MB to a few MB.
* ``check/``  the check texts and their fp32 CPU embeddings (query and
  passage), computed here by Python onnxruntime on ``models/out/e5-small``.
* ``models/e5-large-arch{,-fp16}/``  graphs whose weights live in external
  data that ``gpu_bench.py materialize`` generates on the GPU machine from
  ``recipe.json`` (seeded normal / ones / zeros per tensor: 2 GB that never
  has to travel).
* ``corpus/``  mixed-length real text (paragraphs of the dev sets, some
  joined into long passages) as ``corpus.jsonl``, and the same texts as
  token ids (``ids.npy`` + ``offsets.npy``) for the PyTorch baseline.

Usage: ``prep.py [--out DIR] [--tokens N]``
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))
import convert  # noqa: E402

EVAL = ROOT.parent / "shared" / "evaldata"


def log(msg: str) -> None:
    print(f"[gpu-prep] {msg}", file=sys.stderr, flush=True)


def check_set(out: Path) -> list[str]:
    """Check texts (parity + held-out, within 512 tokens) and CPU fp32 references."""
    from tokenizers import Tokenizer

    base = ROOT / "models/out/e5-small"
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.no_truncation()
    texts = [t for t in convert.parity_texts() + convert.heldout_texts()
             if t.strip() and len(tok.encode("passage: " + t).ids) <= 512 and len(tok.encode("query: " + t).ids) <= 512]
    d = out / "check"
    d.mkdir(parents=True, exist_ok=True)
    (d / "check.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    for kind in ["query", "passage"]:
        ref = convert.ort_pooled(base / "model.onnx", tok, texts, kind + ": ").astype(np.float32)
        np.save(d / f"cpu_fp32_{kind}.npy", ref)
    log(f"check set: {len(texts)} texts, CPU fp32 references for query and passage")
    used = {i for t in texts for k in ["query: ", "passage: "] for i in tok.encode(k + t).ids}
    return sorted(used)


def pruned_e5_small(out: Path, used: list[int]) -> None:
    src = ROOT / "models/out/e5-small-fp16"
    dst = out / "models/e5-small-fp16-check"
    dst.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src / "model.onnx"))
    for init in model.graph.initializer:
        if init.name == "emb.word":
            w = numpy_helper.to_array(init)
            keep = np.zeros_like(w)
            keep[used] = w[used]
            init.CopyFrom(numpy_helper.from_array(keep, init.name))
    onnx.save_model(model, str(dst / "model.onnx"))
    (dst / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["name"] = "e5-small-fp16-check"
    manifest["purpose"] = (f"GPU parity check only: e5-small-fp16 with the {len(used)} word-embedding rows "
                           "the check texts use; every other row is zero")
    convert.write_manifest(dst, manifest, [dst / "model.onnx", dst / "tokenizer.json"])
    log(f"e5-small-fp16-check: kept {len(used)} of {w.shape[0]} embedding rows")


def skeleton_saver(recipe: dict):
    """A ``save(model, path)`` that moves every large float tensor to external
    data without writing it, recording how to regenerate it."""

    def save(model: onnx.ModelProto, path: Path) -> list[Path]:
        data_name = path.name + ".data"
        offset = 0
        tensors = []
        for init in model.graph.initializer:
            if init.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
                continue
            arr = numpy_helper.to_array(init)
            if arr.nbytes < 4096:
                continue
            a32 = arr.astype(np.float32)
            if not a32.any():
                fill = {"fill": "zeros"}
            elif np.all(a32 == 1.0):
                fill = {"fill": "ones"}
            else:
                fill = {"fill": "normal", "std": float(a32.std())}
            dtype = "float16" if init.data_type == TensorProto.FLOAT16 else "float32"
            tensors.append({"name": init.name, "offset": offset, "length": arr.nbytes, "dtype": dtype,
                            "shape": list(arr.shape), **fill})
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.ClearField("int32_data")
            init.data_location = TensorProto.EXTERNAL
            del init.external_data[:]
            for k, v in [("location", data_name), ("offset", str(offset)), ("length", str(arr.nbytes))]:
                e = init.external_data.add()
                e.key, e.value = k, v
            offset += (arr.nbytes + 4095) // 4096 * 4096
        onnx.save_model(model, str(path))
        recipe.update({"data": data_name, "size": offset, "seed": 0, "tensors": tensors})
        (path.parent / "recipe.json").write_text(json.dumps(recipe, indent=1))
        return [path]

    return save


def skeletons(out: Path) -> None:
    wheels, work = ROOT / ".tools/wheels", ROOT / "models/out/.work"
    for name, fp16 in [("e5-large-arch-fp16", True), ("e5-large-arch", False)]:
        dst = out / "models" / name
        dst.mkdir(parents=True, exist_ok=True)
        recipe: dict = {}
        convert.write_e5_large(name, convert.e5_large_model(name, fp16=fp16), dst, work, wheels,
                               save=skeleton_saver(recipe))
        log(f"{name}: skeleton with {len(recipe['tensors'])} external tensors, {recipe['size'] / 1e9:.2f} GB "
            "to generate on the device")


def paragraphs() -> list[str]:
    """Unique paragraphs of the four dev sets (read by path, never copied)."""
    out: list[str] = []

    def ctx(items):
        for title, sents in items:
            out.append(f"{title}. " + " ".join(s.strip() for s in sents))

    hp = EVAL / "hotpotqa/hotpot_original_schema.json"
    if hp.exists():
        for ex in json.loads(hp.read_text()):
            ctx(ex["context"])
    wk = EVAL / "2wikimultihopqa/2wiki_sample.json"
    if wk.exists():
        for ex in json.loads(wk.read_text()):
            ctx(ex["context"])
    mq = EVAL / "musique/musique_ans_sample.jsonl"
    if mq.exists():
        for line in mq.read_text().splitlines():
            if line.strip():
                for p in json.loads(line)["paragraphs"]:
                    out.append(f"{p['title']}. {p['paragraph_text']}")
    sq = EVAL / "squad_v2/squad_v2_dev_subset.json"
    if sq.exists():
        raw = json.loads(sq.read_text())
        for art in raw["data"] if isinstance(raw, dict) else raw:
            for p in art.get("paragraphs", []):
                out.append(p["context"])
    if not out:
        raise SystemExit(f"no dev sets under {EVAL}")
    return list(dict.fromkeys(out))


def corpus(out: Path, target_tokens: int, tokenizer: Path | None = None) -> None:
    """Mixed lengths: the paragraphs as they are, plus one in five joined with
    its neighbours into a long passage; every text fits 512 tokens with the
    prefix; repeated (shuffled) up to the target."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer or out / "models/e5-large-arch-fp16/tokenizer.json"))
    tok.no_truncation()
    paras = paragraphs()
    rng = random.Random(0)
    texts = []
    for i, p in enumerate(paras):
        texts.append(p)
        if i % 5 == 0:
            texts.append(" ".join(paras[i:i + rng.randint(3, 6)]))
    fitted = []
    for t in texts:
        ids = tok.encode("passage: " + t).ids
        if len(ids) > 512:
            words = t.split()
            while len(tok.encode("passage: " + " ".join(words)).ids) > 512:
                words = words[: int(len(words) * 0.9)]
            t = " ".join(words)
        fitted.append(t)
    lens = [len(tok.encode("passage: " + t).ids) for t in fitted]
    base = sum(lens)
    reps = max(1, -(-target_tokens // base))
    order = [i for _ in range(reps) for i in range(len(fitted))]
    rng.shuffle(order)
    d = out / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "corpus.jsonl", "w") as f:
        for i in order:
            f.write(json.dumps({"text": fitted[i]}) + "\n")
    ids = [tok.encode("passage: " + fitted[i]).ids for i in order]
    offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.int64)
    np.save(d / "ids.npy", np.concatenate([np.array(x, np.int32) for x in ids]))
    np.save(d / "offsets.npy", offsets)
    ls = np.array([len(x) for x in ids])
    stats = {"texts": len(ids), "tokens": int(offsets[-1]), "unique_texts": len(fitted), "repeats": reps,
             "len_p10": int(np.percentile(ls, 10)), "len_p50": int(np.percentile(ls, 50)),
             "len_p90": int(np.percentile(ls, 90)), "len_max": int(ls.max())}
    (d / "stats.json").write_text(json.dumps(stats, indent=1))
    log(f"corpus: {stats}")


def variants(out: Path) -> None:
    """The optimizer's GPU variants (packed, key-length mask) of the E5-large
    skeleton and of the check model, and their fused-operator counts."""
    import subprocess

    script = ROOT / "models/optimize_gpu.py"
    for name, heads, hidden in [("e5-large-arch-fp16", 16, 1024), ("e5-small-fp16-check", 12, 384)]:
        subprocess.run([sys.executable, str(script), str(out / "models" / name), "--heads", str(heads),
                        "--hidden", str(hidden), "--report", str(out / "optimizer" / f"{name}.json")],
                       check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu/stage")
    ap.add_argument("--tokens", type=int, default=1_500_000, help="corpus size in model tokens")
    ap.add_argument("--rehearse", action="store_true",
                    help="only the check set and a corpus in e5-small's tokenizer (benches/gpu/run.sh REHEARSE=1)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rehearse:
        check_set(args.out)
        corpus(args.out, args.tokens, ROOT / "models/out/e5-small/tokenizer.json")
        return
    pruned_e5_small(args.out, check_set(args.out))
    skeletons(args.out)
    variants(args.out)
    corpus(args.out, args.tokens)


if __name__ == "__main__":
    main()
