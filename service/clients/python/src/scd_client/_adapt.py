"""What the LangChain and LlamaIndex adapters share: field names and kinds for documents."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ._files import kind_of

# the server's limit on a field name (scd-context MAX_FIELD_NAME_BYTES)
_MAX_NAME_BYTES = 256


def unique_names(candidates: Sequence[Sequence[Any]]) -> list[str]:
    """Field names for n documents: the first candidate list whose values are all
    distinct non-empty strings that fit a field name, else ``doc-0``, ``doc-1``, …"""
    for values in candidates:
        if not values:
            continue
        ok = all(
            isinstance(v, str) and v.strip() and len(v.encode("utf-8")) <= _MAX_NAME_BYTES for v in values
        )
        if ok and len(set(values)) == len(values):
            return list(values)
    n = max((len(v) for v in candidates), default=0)
    return [f"doc-{i}" for i in range(n)]


def field_kind(metadata: Mapping[str, Any], *path_keys: str) -> str:
    """A field's kind: ``metadata["scd_kind"]`` if set, else the extension of the
    first path among ``path_keys``, else prose."""
    kind = metadata.get("scd_kind")
    if isinstance(kind, str) and kind:
        return kind
    for key in path_keys:
        v = metadata.get(key)
        if isinstance(v, str) and v:
            return kind_of(v)
    return "prose"

