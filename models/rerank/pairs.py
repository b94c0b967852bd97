"""How a (query, passage) pair becomes the reranker's input, shared by the
trainer (model.py, train.py) and the ONNX build's check (build_onnx.py); the
engine's reranker builds the same layout in Rust.

Each side is tokenized without special tokens; the query is cut to
QUERY_MAX_TOKENS, the passage to what is left of MAX_TOKENS; the ids are
``[CLS] q [SEP] p [SEP]`` with token types 0 for ``[CLS] q [SEP]`` and 1 for
``p [SEP]``.
"""
from __future__ import annotations

import numpy as np

MAX_TOKENS = 256
QUERY_MAX_TOKENS = 64


class Inputs:
    """The pair layout (module doc) over a BERT tokenizer.json."""

    def __init__(self, tokenizer_json: bytes):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json.decode())
        self.tok.no_truncation()
        self.tok.no_padding()
        self.cls = self.tok.token_to_id("[CLS]")
        self.sep = self.tok.token_to_id("[SEP]")

    def ids(self, query: str, passage: str, max_tokens: int = MAX_TOKENS) -> tuple[list[int], list[int]]:
        q = self.tok.encode(query, add_special_tokens=False).ids[:QUERY_MAX_TOKENS]
        p = self.tok.encode(passage, add_special_tokens=False).ids[: max(0, max_tokens - 3 - len(q))]
        ids = [self.cls, *q, self.sep, *p, self.sep]
        types = [0] * (len(q) + 2) + [1] * (len(p) + 1)
        return ids, types

    def batch(self, pairs: list[tuple[str, str]], max_tokens: int = MAX_TOKENS, pad_to: int = 0):
        rows = [self.ids(q, p, max_tokens) for q, p in pairs]
        L = max(pad_to, max(len(r[0]) for r in rows))
        ids = np.zeros((len(rows), L), np.int32)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for i, (a, t) in enumerate(rows):
            ids[i, : len(a)], types[i, : len(t)], mask[i, : len(a)] = a, t, 1
        return ids, types, mask


def passage(field: str, text: str) -> str:
    """The engine's passage template: ``{field}\\n{text}``, or the text alone."""
    return f"{field}\n{text}" if field else text
