"""A context from files: the rules of ``scd context`` and ``scd compress --files``.

Each file becomes a field named by its path (as given, without a leading
``./``), its kind from the extension; a folder brings its files, walked in
sorted order, leaving out hidden entries, ``target/`` and ``node_modules/``;
files that are not UTF-8 text (or hold a NUL byte) are skipped.
"""

from __future__ import annotations

import os
from typing import Iterable

# the extension -> kind table of `scd context` (service/src/cli/context.rs)
_KINDS: dict[str, str] = {}
for _ext in (
    "rs py js mjs ts tsx jsx go java c h cc cpp hpp cs rb kt swift scala sh bash lua php toml yaml yml".split()
):
    _KINDS[_ext] = "code"
_KINDS.update({"log": "log", "json": "json", "jsonl": "json", "ndjson": "json"})
_KINDS.update({"csv": "table", "tsv": "table", "sql": "table", "md": "markdown", "markdown": "markdown"})
_KINDS.update({"txt": "prose", "rst": "prose", "adoc": "prose"})


def kind_of(path: str) -> str:
    """The field kind a path's extension names (``prose`` when it names none)."""
    base = os.path.basename(path)
    _, ext = os.path.splitext(base)
    return _KINDS.get(ext[1:].lower(), "prose") if ext else "prose"


def _skipped_dir(name: str) -> bool:
    return name.startswith(".") or name in ("target", "node_modules")


def _walk(root: str, out: list[str]) -> None:
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            if not _skipped_dir(name):
                _walk(path, out)
        elif os.path.isfile(path) and not name.startswith("."):
            out.append(path)


def expand(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files ``paths`` name, in order, each once (``FileNotFoundError`` for a missing one)."""
    files: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            _walk(p, files)
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    seen: set[str] = set()
    return [f for f in files if not (f in seen or seen.add(f))]


def _name(path: str) -> str:
    while path.startswith("./"):
        path = path[2:]
    return path.replace(os.sep, "/")


def fields_from_files(paths: Iterable[str | os.PathLike[str]]) -> list[dict]:
    """One context field per text file under ``paths`` (``ValueError`` when there is none)."""
    paths = list(paths)
    fields = []
    for path in expand(paths):
        with open(path, "rb") as f:
            raw = f.read()
        if b"\0" in raw:
            continue
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        fields.append({"name": _name(path), "kind": kind_of(path), "content": content})
    if not fields:
        raise ValueError(f"files: no text file among {[os.fspath(p) for p in paths]}")
    return fields
