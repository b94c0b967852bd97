"""The encoder graph every SCD model shares: a post-LN BERT / XLM-R encoder
written as ONNX (standard ops or ONNX Runtime's fused contrib ops, fp32 or
fp16) with masked mean pooling, and how it is saved. ``convert.py`` and
``rerank/build_onnx.py`` fill it with weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MASK_NEG = -10000.0  # additive attention mask; exp() of it is 0 in fp32 and fp16


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
