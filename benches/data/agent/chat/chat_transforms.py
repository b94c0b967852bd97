"""Chat transforms: turn a bundled discussion file into one line per turn ("Name: text").

chat:dircproxy  IRC log written by dircproxy ("[15 Jan 19:14] <nick!user@host> +text"): one line per message,
                "[time] nick: text"; joins, parts, (dis)connects and empty messages are dropped; "* nick does"
                actions are kept as "[time] * nick does".
chat:discourse  Discourse topic JSON (the /t/ID.json payload): a "topic: <title>" line, then one line per post,
                "username: text", with the post's HTML reduced to text and whitespace collapsed.
chat:mbox       mbox of a mailing list: a "topic: <subject>" line whenever the thread subject changes, then one
                line per message, "Sender Name: text"; quoted lines (">"), attribution lines ("On ... wrote:",
                "<date> <name> <addr>:"), the archive's scrubbed-attachment footer and list footers are dropped.
"""
from __future__ import annotations

import email.header
import html
import json
import mailbox
import os
import re
import tempfile


def _ws(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def dircproxy(raw: str) -> str:
    out = []
    for line in raw.split("\n"):
        m = re.match(r"^\[([^\]]+)\] <([^!>]+)(?:![^>]*)?> ?[+-]?(.*)$", line)
        if m:
            text = _ws(m.group(3))
            if text:
                out.append(f"[{m.group(1)}] {m.group(2)}: {text}")
            continue
        m = re.match(r"^\[([^\]]+)\] \* (\S+) (.*)$", line)
        if m:
            out.append(f"[{m.group(1)}] * {m.group(2)} {_ws(m.group(3))}")
    return "\n".join(out)


def _html_text(s: str) -> str:
    s = re.sub(r"<(br|/p|/li|/blockquote|/aside)[^>]*>", " ", s)
    s = re.sub(r"<[^>]+>", " ", s)
    return _ws(html.unescape(s))


def discourse(raw: str) -> str:
    d = json.loads(raw)
    out = [f"topic: {d.get('title', '')}"]
    for p in d["post_stream"]["posts"]:
        out.append(f"{p['username']}: {_html_text(p['cooked'])}")
    return "\n".join(out)


def _decode(h) -> str:
    if h is None:
        return ""
    return _ws("".join(b.decode(c or "utf-8", "replace") if isinstance(b, bytes) else b
                       for b, c in email.header.decode_header(str(h))))


def _name(frm: str) -> str:
    m = re.search(r"\(([^)]+)\)", frm)
    if m:
        return _decode(m.group(1))
    m = re.match(r"\s*\"?([^\"<]+?)\"?\s*<", frm)
    return m.group(1) if m else frm


def _body(msg) -> str:
    part = msg
    if msg.is_multipart():
        part = next((p for p in msg.walk() if p.get_content_type() == "text/plain"), None)
        if part is None:
            return ""
    payload = part.get_payload(decode=True) or b""
    text = payload.decode(part.get_content_charset() or "utf-8", "replace")
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("-------------- next part") or s.startswith("_______________"):
            break
        if s.startswith(">") or re.match(r"^On .* wrote:$", s) or re.match(r"^\d{4}-\d\d-\d\d .*<[^>]+>:$", s):
            continue
        if re.match(r"^On .*\d{4}.*(at|,) .*$", s) and s.endswith("wrote:"):
            continue
        keep.append(s)
    return _ws(" ".join(keep))


def mbox(raw: str) -> str:
    fd, path = tempfile.mkstemp(suffix=".mbox")
    with os.fdopen(fd, "w") as f:
        f.write(raw)
    try:
        out, last = [], None
        for msg in mailbox.mbox(path):
            subj = re.sub(r"^((re|fwd?):\s*)+", "", _decode(msg["Subject"]), flags=re.I)
            if subj != last:
                out.append(f"topic: {subj}")
                last = subj
            out.append(f"{_name(_decode(msg['From']))}: {_body(msg)}")
        return "\n".join(out)
    finally:
        os.unlink(path)


def apply(name: str, raw: str, spec: dict) -> str:
    return {"chat:dircproxy": dircproxy, "chat:discourse": discourse, "chat:mbox": mbox}[name](raw)
