"""Text transforms named in the cases' `transform` (shared by the kinds docs, json, logs and chat)."""
from __future__ import annotations

import json

JSON_PRETTY = "json.dumps(indent=2, ensure_ascii=False)"


def apply(name: str, raw: str, spec: dict) -> str:
    if name == "whole file" or name == "window":
        return raw
    if name == JSON_PRETTY:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    if name.startswith("chat:"):
        import importlib.util
        from pathlib import Path
        p = Path(__file__).resolve().parent / "chat" / "chat_transforms.py"
        sp = importlib.util.spec_from_file_location("chat_transforms", p)
        m = importlib.util.module_from_spec(sp)
        sp.loader.exec_module(m)
        return m.apply(name, raw, spec)
    raise SystemExit(f"unknown transform {name}")
