"""ONNX Runtime's exact int8 kernel (`session.x64quantprecision`) on this CPU:
e5-small-int8's speed and output with and without it, in the same run.

On x86-64 without VNNI the default U8S8 MatMul saturates, and scd turns the
exact U8U8 kernel on (engine/src/encoder/cpu.rs, `int8_saturates`); with VNNI it
leaves it off. This prints which case this CPU is, both tokens/s (interleaved,
three rounds), the ratio, and the worst cosine between the two outputs.

Usage: .tools/venv/bin/python benches/scripts/int8_exact_kernel.py [MODELS_DIR]
"""
import json
import sys
import time
from pathlib import Path

import onnxruntime as ort
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from parity import has_vnni, ort_pooled  # noqa: E402

models = Path(sys.argv[1] if len(sys.argv) > 1 else "models/out")
tok = Tokenizer.from_file(str(models / "e5-small" / "tokenizer.json"))
texts = json.loads((models / "e5-small" / "reference.json").read_text())["heldout_texts"][:48]
manifest = json.loads((models / "e5-small-int8" / "manifest.json").read_text())
tokens = sum(len(tok.encode("passage: " + t).ids) for t in texts)
print(f"CPU: {'VNNI' if has_vnni() else 'no VNNI'}, ONNX Runtime {ort.__version__}")


def session(exact: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    for k, v in manifest.get("session_config", {}).items():
        so.add_session_config_entry(k, v)
    if exact:
        so.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(str(models / "e5-small-int8" / "model.onnx"), so, providers=["CPUExecutionProvider"])


sessions = {exact: session(exact) for exact in (False, True)}
rates = {False: [], True: []}
outs = {}
for rnd in range(3):
    for exact in (False, True):
        t0 = time.perf_counter()
        outs[exact] = ort_pooled(sessions[exact], tok, texts, "passage: ")
        rates[exact].append(tokens / (time.perf_counter() - t0))
        print(f"round {rnd}: exact={exact}: {rates[exact][-1]:.0f} tokens/s ({len(texts)} texts, {tokens} tokens)")
best = {k: max(v) for k, v in rates.items()}
print(f"best of 3: default {best[False]:.0f}, exact {best[True]:.0f} tokens/s; exact/default {best[True] / best[False]:.2f}x")
print(f"worst cosine between the two outputs: {(outs[False] * outs[True]).sum(1).min():.6f}")
