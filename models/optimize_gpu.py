#!/usr/bin/env python3
"""GPU variants of a fused fp16 BERT model, made by ONNX Runtime's
transformer optimizer (``onnxruntime.transformers``, from the pinned
onnxruntime wheel; nothing is downloaded).

Variants, each written as a model folder beside the source:

* ``<name>-packed``  the optimizer (``model_type="bert"``, fp16, GPU) then
  ``convert_to_packing_mode``: ``Attention`` becomes ``PackedAttention``
  between one ``RemovePadding`` (after the embeddings) and one
  ``RestorePadding`` (before the output): the layers compute on real tokens
  only. The inputs and outputs stay those of the source, so ``scd`` runs it
  unchanged. CUDA only: the CPU provider has no kernel for these ops.
* ``<name>-keylen``  ``Attention``'s mask given as key lengths (``[batch]``,
  right padding) instead of the 2-D mask, which lets ONNX Runtime pick its
  memory-efficient / flash kernels; runs on the CPU too.

The optimizer's fused-operator counts, for the source graph and for each
variant, go to ``--report`` (JSON) and to the log. Works on skeletons (weights
in external data that is not there): the weights are never read, and each
variant refers to the same external data file as its source.

Also tried on the standard (unfused) fp32 graph of ``models/convert.py``:
``--standard`` adds that run's counts to the report (on e5-small it fuses
SkipLayerNormalization only; attention is not recognised, which is why the
variants start from the hand-fused graph).

Usage: ``optimize_gpu.py MODEL_DIR --heads N --hidden H [--report FILE] [--standard DIR]``
(needs ``sympy``, pinned in models/requirements.txt, for the optimizer's shape inference)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert  # noqa: E402


def log(msg: str) -> None:
    print(f"[optimize-gpu] {msg}", file=sys.stderr, flush=True)


def contrib_ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft").items()))


def optimized(model: onnx.ModelProto, heads: int, hidden: int):
    """The optimizer's pass over ``model`` (fusions only, no ONNX Runtime session)."""
    from onnxruntime.transformers import optimizer

    m = optimizer.optimize_model(model, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                                 use_gpu=True, only_onnxruntime=False)
    return m, {k: v for k, v in m.get_fused_operator_statistics().items() if v}


def key_lengths(model: onnx.ModelProto) -> int:
    """Feeds every ``Attention`` the key lengths (``ReduceSum`` of the int32
    mask over the sequence) instead of the 2-D mask; returns how many."""
    g = model.graph
    masks = {n.input[3] for n in g.node if n.op_type == "Attention" and len(n.input) > 3 and n.input[3]}
    if len(masks) != 1:
        raise SystemExit(f"expected one mask shared by every Attention, found {sorted(masks)}")
    mask = masks.pop()
    axes = onnx.helper.make_tensor("keylen_axes", onnx.TensorProto.INT64, [1], [1])
    g.initializer.append(axes)
    reduce = onnx.helper.make_node("ReduceSum", [mask, "keylen_axes"], ["mask_keylen"], name="mask_keylen",
                                   keepdims=0)
    first = next(i for i, n in enumerate(g.node) if n.op_type == "Attention")
    g.node.insert(first, reduce)
    count = 0
    for n in g.node:
        if n.op_type == "Attention":
            n.input[3] = "mask_keylen"
            count += 1
    return count


def write_variant(src: Path, name: str, model: onnx.ModelProto, why: str, stats: dict) -> Path:
    dst = src.parent / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    onnx.save_model(model, str(dst / "model.onnx"))
    for extra in ["tokenizer.json", "recipe.json"]:
        if (src / extra).exists():
            shutil.copy(src / extra, dst / extra)
    manifest = json.loads((src / "manifest.json").read_text())
    manifest.update(name=name, variant_of=manifest.get("name"), graph=why, purpose=f"GPU: {why}",
                    fused_ops=stats)
    manifest.pop("reference", None)
    convert.write_manifest(dst, manifest, [dst / "model.onnx", dst / "tokenizer.json"])
    log(f"{name}: {stats}")
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--standard", type=Path, help="a standard-graph model folder to try the optimizer on as well")
    args = ap.parse_args()
    import onnxruntime

    src = args.model_dir
    base = onnx.load(str(src / "model.onnx"), load_external_data=False)
    report = {"onnxruntime": onnxruntime.__version__, "source": src.name, "source_ops": contrib_ops(base)}

    m, stats = optimized(base, args.heads, args.hidden)
    report["optimizer_fused_ops"] = stats
    from onnxruntime.transformers.convert_to_packing_mode import PackingMode

    packing = PackingMode(m)
    packing.convert()
    packed = packing.model.model
    ops = contrib_ops(packed)
    if not ops.get("PackedAttention") or not ops.get("RemovePadding"):
        raise SystemExit(f"packing mode did not apply: {ops}")
    report["packed_ops"] = ops
    write_variant(src, f"{src.name}-packed", packed,
                  "packed (padding-free) attention: RemovePadding, PackedAttention, RestorePadding", ops)

    keylen = onnx.load(str(src / "model.onnx"), load_external_data=False)
    n = key_lengths(keylen)
    report["keylen_attention_nodes"] = n
    write_variant(src, f"{src.name}-keylen", keylen, "fused attention with the mask as key lengths",
                  contrib_ops(keylen))

    if args.standard:
        std = onnx.load(str(args.standard / "model.onnx"), load_external_data=False)
        report["standard_graph_fused_ops"] = optimized(std, args.heads, args.hidden)[1]
        log(f"standard graph {args.standard.name}: {report['standard_graph_fused_ops']}")
    text = json.dumps(report, indent=1)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
