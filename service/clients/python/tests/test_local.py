"""What the client decides before (or without) a real server: argument checks,
contexts from files, retries after 429/503 (against a stub HTTP server), the
did:wba header, and that no session token shows in a repr."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import scd_client
from scd_client import _files
from scd_client._client import Compressed

from conftest import did_document, need

# nothing listens here: a call that reached the network would raise ScdError, not ValueError
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"context": "x", "budget": 10, "rate": 0.5}, "budget and rate: give exactly one"),
        ({"context": "x"}, "budget and rate: give exactly one"),
        ({"budget": 10}, "context and files: give exactly one"),
        ({"context": "x", "files": ["."], "budget": 10}, "context and files: give exactly one"),
        ({"context": "x", "budget": 10, "budget_tokenizer": "e5"}, "budget_tokenizer: pass it as tokenizer="),
        ({"context": ["a", {"name": "b", "content": "c"}], "budget": 10}, "context: a list must hold only"),
        ({"context": {"fields": [], "extra": 1}, "budget": 10}, 'context: a dict must be {"fields": [...]}'),
    ],
)
def test_bad_arguments_raise_value_error_before_any_request(kwargs, message):
    with pytest.raises(ValueError) as e:
        scd_client.Client(NOWHERE).compress("t", **kwargs)
    assert str(e.value).startswith(message)


def test_client_arguments_are_checked():
    with pytest.raises(ValueError, match="base_url"):
        scd_client.Client("127.0.0.1:9090")
    with pytest.raises(ValueError, match="did and signing_key"):
        scd_client.Client(NOWHERE, did="did:wba:x")
    with pytest.raises(ValueError, match="only for an https"):
        scd_client.Client(NOWHERE, ca_file="ca.pem")
    with pytest.raises(ValueError, match="32 bytes"):
        scd_client.Client(NOWHERE, did="did:wba:x", signing_key=b"short")


def test_an_unreachable_server_is_an_scd_error_without_status():
    with pytest.raises(scd_client.ScdError) as e:
        scd_client.Client(NOWHERE, timeout=5).compress("t", "x", budget=10)
    assert e.value.status is None and type(e.value) is scd_client.ScdError


def test_files_become_fields_in_order_with_kinds(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "lib.rs").write_text("fn main() {}\n")
    (tmp_path / "a.py").write_text("print('hi')\n")
    (tmp_path / "notes.md").write_text("# Notes\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "run.log").write_text("INFO started\n")
    (tmp_path / "cfg.json").write_text("{}\n")
    (tmp_path / "README").write_text("plain text\n")
    (tmp_path / ".hidden.py").write_text("secret = 1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "x.js").write_text("x\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    root = str(tmp_path)
    fields = _files.fields_from_files([root, root + "/a.py"])
    got = [(f["name"], f["kind"]) for f in fields]
    assert got == [
        (f"{root}/README", "prose"),
        (f"{root}/a.py", "code"),
        (f"{root}/b/lib.rs", "code"),
        (f"{root}/cfg.json", "json"),
        (f"{root}/data.csv", "table"),
        (f"{root}/notes.md", "markdown"),
        (f"{root}/run.log", "log"),
    ]
    assert fields[1]["content"] == "print('hi')\n"


def test_files_named_relative_without_dot_slash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.ts").write_text("let x = 1;\n")
    assert [f["name"] for f in _files.fields_from_files(["./src/"])] == ["src/x.ts"]


def test_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        _files.fields_from_files([tmp_path / "missing"])
    (tmp_path / "blob.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="no text file"):
        _files.fields_from_files([tmp_path])


def test_contexts_of_every_accepted_shape():
    from scd_client._client import _fields

    assert _fields("hello") == [{"name": "context", "kind": "prose", "content": "hello"}]
    assert _fields(["a", "b"]) == [
        {"name": "doc-0", "kind": "prose", "content": "a"},
        {"name": "doc-1", "kind": "prose", "content": "b"},
    ]
    f = {"name": "n", "kind": "code", "content": "c", "confidential": True}
    assert _fields([f]) == [f] and _fields({"fields": [f]}) == [f]


def test_chunk_text_is_sliced_by_byte_span_and_the_token_never_shows():
    content = "héllo wörld: charges fail"
    raw = content.encode()
    start = raw.index("wörld".encode())
    reply = {
        "text": "wörld",
        "chunks": [{"field": "f", "id": "f#0", "score": 0.9, "tokens": 2, "span": [start, start + len("wörld".encode())]}],
        "totals": {"context_tokens": 10, "sent_tokens": 2, "reduction_ratio": 5.0, "tokenizer": "o200k"},
        "session_id": "s-1",
        "session_token": "TOPSECRET",
    }
    r = Compressed(scd_client.Client(NOWHERE), reply, {"f": raw})
    assert r.chunks[0].text == "wörld" and r.chunks[0].span == (start, start + 6)
    assert (r.origin_tokens, r.sent_tokens, r.ratio) == (10, 2, 5.0)
    assert "session_token" not in r.raw and "TOPSECRET" not in json.dumps(r.raw)
    assert "TOPSECRET" not in repr(r) and "TOPSECRET" not in str(r)
    assert reply["session_token"] == "TOPSECRET"  # the caller's dict is left alone


def test_error_bodies_map_to_classes():
    from scd_client._errors import from_response

    body = json.dumps({"error": {"message": "budget: must be at least 1", "type": "invalid_request_error",
                                 "param": "budget", "code": "INVALID_ARGUMENT"}}).encode()
    e = from_response(400, "Bad Request", body, {})
    assert isinstance(e, scd_client.InvalidRequest)
    assert (e.status, e.message, e.param, e.type) == (400, "budget: must be at least 1", "budget", "invalid_request_error")
    assert isinstance(from_response(413, "", b"", {}), scd_client.InvalidRequest)
    assert isinstance(from_response(401, "", b"", {}), scd_client.AuthError)
    assert isinstance(from_response(403, "", b"", {}), scd_client.AuthError)
    assert isinstance(from_response(404, "", b"", {}), scd_client.NotFound)
    assert isinstance(from_response(503, "", b"", {}), scd_client.Unavailable)
    busy = from_response(429, "", b"", {"retry-after-ms": "1500", "Retry-After": "2"})
    assert isinstance(busy, scd_client.Busy) and busy.retry_after_s == 1.5
    assert from_response(429, "", b"", {"Retry-After": "2"}).retry_after_s == 2.0
    other = from_response(500, "Internal Server Error", b"oops", {})
    assert type(other) is scd_client.ScdError and other.message == "oops"


class _Stub:
    """A stub HTTP server answering each request with the next of `answers` (status, headers)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[tuple[str, str, dict, bytes]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                stub.requests.append((self.command, self.path, dict(self.headers), self.rfile.read(n)))
                status, headers = stub.answers.pop(0)
                if status == 200:
                    body = json.dumps({"text": "ok", "chunks": [], "totals": {}, "session_id": "s",
                                       "session_token": "t"}).encode()
                else:
                    body = json.dumps({"error": {"message": "compress slots: all 8 busy", "type": "rate_limit_error",
                                                 "param": None, "code": "RESOURCE_EXHAUSTED"}}).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_429_and_503_are_retried_after_the_servers_hint(monkeypatch):
    waits = []
    monkeypatch.setattr("scd_client._client.time.sleep", waits.append)
    stub = _Stub([(429, {"Retry-After": "1", "retry-after-ms": "40"}), (503, {"Retry-After": "2"}), (200, {})])
    try:
        r = scd_client.Client(stub.url, retries=3).compress("t", "x", budget=5)
    finally:
        stub.close()
    assert r.text == "ok" and len(stub.requests) == 3
    assert waits == [0.04, 2.0]


def test_retries_end_with_busy_and_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setattr("scd_client._client.time.sleep", lambda s: None)
    stub = _Stub([(429, {"retry-after-ms": "250"})] * 3)
    try:
        with pytest.raises(scd_client.Busy) as e:
            scd_client.Client(stub.url, retries=2).compress("t", "x", budget=5)
        assert e.value.retry_after_s == 0.25 and e.value.status == 429 and len(stub.requests) == 3
    finally:
        stub.close()
    stub = _Stub([(400, {}), (200, {})])
    try:
        with pytest.raises(scd_client.InvalidRequest):
            scd_client.Client(stub.url).compress("t", "x", budget=5)
        assert len(stub.requests) == 1
    finally:
        stub.close()


def test_every_request_is_signed_afresh(monkeypatch):
    nacl_signing = need("nacl.signing")
    monkeypatch.setattr("scd_client._client.time.sleep", lambda s: None)
    seed = bytes(32)
    stub = _Stub([(503, {}), (200, {})])
    try:
        scd_client.Client(stub.url, did="did:wba:a.example:me", signing_key=seed, aud="svc").compress("t", "x", budget=5)
    finally:
        stub.close()
    headers = [h["Authorization"] for _, _, h, _ in stub.requests]
    assert len(set(headers)) == 2
    verify = nacl_signing.SigningKey(seed).verify_key
    for h in headers:
        assert h.startswith("DIDWba ")
        parts = dict(p.split("=", 1) for p in h[len("DIDWba "):].split(", "))
        parts = {k: v.strip('"') for k, v in parts.items()}
        assert parts["did"] == "did:wba:a.example:me" and parts["verification_method"] == "key-1"
        payload = json.dumps({"aud": "svc", "did": parts["did"], "nonce": parts["nonce"],
                              "timestamp": parts["timestamp"]}, sort_keys=True, separators=(",", ":")).encode()
        sig = base64.urlsafe_b64decode(parts["signature"] + "=" * (-len(parts["signature"]) % 4))
        verify.verify(payload, sig)


def test_the_did_document_matches_an_independent_one(tmp_path):
    need("nacl.signing")

    from scd_client import did

    key = did.signing_key(bytes(range(32)))
    pub = bytes(key.verify_key)
    assert did.document("did:wba:h.example:a:b", pub) == did_document("did:wba:h.example:a:b", pub)
    assert did.document_path(tmp_path, "did:wba:h.example:a:b") == str(tmp_path / "h.example" / "a" / "b" / "did.json")


def test_adapters_need_exactly_one_budget():
    need("langchain_core")
    need("llama_index.core")
    from scd_client.langchain import ScdCompressor
    from scd_client.llamaindex import ScdNodePostprocessor

    c = scd_client.Client(NOWHERE)
    for cls in (ScdCompressor, ScdNodePostprocessor):
        with pytest.raises(ValueError, match="budget and rate"):
            cls(client=c)
        with pytest.raises(ValueError, match="budget and rate"):
            cls(client=c, budget=10, rate=0.5)
        assert cls(client=c, rate=0.5).rate == 0.5


def test_adapter_field_names():
    from scd_client._adapt import unique_names

    assert unique_names([["a", "b"], ["x", "y"]]) == ["a", "b"]
    assert unique_names([["a", "a"], ["x", "y"]]) == ["x", "y"]
    assert unique_names([["a", None], [None, None]]) == ["doc-0", "doc-1"]
    assert unique_names([["x" * 300]]) == ["doc-0"]
