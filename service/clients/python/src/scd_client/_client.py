"""The REST client: :class:`Client`, and what its calls answer.

The transport is the standard library's (``urllib.request``, ``ssl``,
``json``): one HTTP request per call, JSON both ways, a fresh did:wba
``Authorization`` header per request when a DID is configured. 429 and 503
are retried after the server's hint (``retry-after-ms``, else
``Retry-After``) up to ``retries`` times; every other error raises at once.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import json
import math
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping, Sequence

from . import _errors
from ._errors import NotFound, ScdError
from ._files import fields_from_files

__version__ = "0.1.0"

#: The header that carries a session's token (never put in a URL).
SESSION_TOKEN_HEADER = "x-scd-session-token"

# texts per /v1/embeddings request (the server's --max-texts is 256 by default)
_EMBED_BATCH = 128
# the longest wait between two tries, whatever the server's hint says
_MAX_RETRY_WAIT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A selected chunk.

    ``span`` is the chunk's ``[start, end)`` in UTF-8 bytes of its field's
    content; ``text`` is that slice of the content when the client sent the
    field (``None`` otherwise).
    """

    field: str
    id: str
    score: float
    tokens: int
    span: tuple[int, int]
    text: str | None = None


def _chunks(items: Iterable[Mapping[str, Any]], contents: Mapping[str, bytes]) -> list[Chunk]:
    out = []
    for c in items:
        start, end = (int(x) for x in c.get("span", (0, 0)))
        field = c.get("field", "")
        content = contents.get(field)
        text = content[start:end].decode("utf-8", errors="replace") if content is not None else None
        out.append(
            Chunk(
                field=field,
                id=c.get("id", ""),
                score=float(c.get("score", 0.0)),
                tokens=int(c.get("tokens", 0)),
                span=(start, end),
                text=text,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class More:
    """The answer of :meth:`Compressed.more`: the next chunks, never sent before in the session.

    ``text`` is exactly what to hand the receiver; ``reason`` says why
    nothing (or less than the budget) was sent, if so.
    """

    text: str
    chunks: list[Chunk]
    remaining_tokens: int
    reason: str
    sent_tokens: int = 0
    raw: dict = dataclasses.field(default_factory=dict, repr=False)


class Compressed:
    """The answer of :meth:`Client.compress`, and the session it opened.

    ``text`` is exactly what to hand the receiver (within the budget, in the
    budget tokenizer); ``chunks`` are the selected chunks in reading order;
    ``origin_tokens`` and ``sent_tokens`` are the context's and the text's
    sizes, ``ratio`` their quotient; ``raw`` is the server's answer without
    the session's token. :meth:`more` asks the same session for the next
    chunks; :meth:`close` closes it (so does leaving a ``with`` block).
    """

    def __init__(self, client: "Client", reply: dict, contents: Mapping[str, bytes]) -> None:
        reply = dict(reply)
        self._token: str = reply.pop("session_token", "") or ""
        self._client = client
        self._contents = contents
        self._closed = False
        self.raw: dict = reply
        self.text: str = reply.get("text", "")
        self.chunks: list[Chunk] = _chunks(reply.get("chunks", []), contents)
        totals = reply.get("totals", {})
        self.origin_tokens: int = int(totals.get("context_tokens", 0))
        self.sent_tokens: int = int(totals.get("sent_tokens", 0))
        self.tokenizer: str = totals.get("tokenizer", "")
        if self.sent_tokens:
            self.ratio: float = self.origin_tokens / self.sent_tokens
        else:
            self.ratio = math.inf if self.origin_tokens else 1.0
        self.session_id: str = reply.get("session_id", "")
        self.withheld_fields: list[str] = list(reply.get("withheld_fields", []))
        self.warnings: list[str] = list(reply.get("warnings", []))
        self.dropped: dict = dict(reply.get("dropped", {}))

    def __repr__(self) -> str:
        return (
            f"Compressed(session_id={self.session_id!r}, origin_tokens={self.origin_tokens}, "
            f"sent_tokens={self.sent_tokens}, chunks={len(self.chunks)}, tokenizer={self.tokenizer!r})"
        )

    def __str__(self) -> str:
        return self.text

    def __enter__(self) -> "Compressed":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except NotFound:
            pass

    def _headers(self) -> dict[str, str]:
        return {SESSION_TOKEN_HEADER: self._token} if self._token else {}

    def _path(self, suffix: str = "") -> str:
        return "/v1/sessions/" + urllib.parse.quote(self.session_id, safe="") + suffix

    def more(
        self,
        question: str,
        confidence: float = 0.5,
        *,
        chunk_ids: Sequence[str] | None = None,
        max_tokens: int | None = None,
    ) -> More:
        """The next chunks the receiver has not seen, for its specific ``question``.

        ``confidence`` is the receiver's current confidence in [0, 1] (the
        lower, the more it gets); ``chunk_ids`` asks for those chunks by id;
        ``max_tokens`` bounds this reply (default: the first answer's budget).
        """
        body: dict[str, Any] = {"question": question, "current_confidence": confidence}
        if chunk_ids is not None:
            body["chunk_ids"] = list(chunk_ids)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        r = self._client._call("POST", self._path("/more"), body, self._headers())
        return More(
            text=r.get("text", ""),
            chunks=_chunks(r.get("chunks", []), self._contents),
            remaining_tokens=int(r.get("remaining_tokens", 0)),
            reason=r.get("reason", ""),
            sent_tokens=int(r.get("sent_tokens", 0)),
            raw=r,
        )

    def close(self) -> None:
        """Closes the session on the server (a second call does nothing)."""
        if self._closed:
            return
        self._client._call("DELETE", self._path(), None, self._headers())
        self._closed = True


def _fields(context: Any) -> list[dict]:
    """The fields of ``context`` as :meth:`Client.compress` accepts it."""
    if isinstance(context, str):
        return [{"name": "context", "kind": "prose", "content": context}]
    if isinstance(context, Mapping):
        fields = context.get("fields")
        if not isinstance(fields, list) or set(context) != {"fields"}:
            raise ValueError('context: a dict must be {"fields": [...]}')
        return [dict(f) if isinstance(f, Mapping) else f for f in fields]
    if isinstance(context, (list, tuple)):
        if all(isinstance(f, str) for f in context):
            return [{"name": f"doc-{i}", "kind": "prose", "content": c} for i, c in enumerate(context)]
        if all(isinstance(f, Mapping) for f in context):
            return [dict(f) for f in context]
        raise ValueError("context: a list must hold only strings or only field dicts")
    raise TypeError('context: a str, a list of str, a list of field dicts, or {"fields": [...]}')


def _vector(v: Any) -> list[float]:
    if isinstance(v, str):
        a = array.array("f")
        a.frombytes(base64.b64decode(v))
        if sys.byteorder != "little":
            a.byteswap()
        return a.tolist()
    return [float(x) for x in v]


# Seconds a request may take: more than the server's default limit (600 s,
# `scd serve --http-request-timeout-ms`), so the server's 504 arrives first.
DEFAULT_TIMEOUT_S = 610.0


class Client:
    """A client of one SCD server's REST API.

    ``base_url`` is the server's HTTP listener (``scd serve --http-addr``),
    such as ``http://127.0.0.1:9090``. For ``https://`` URLs the server's
    certificate is checked against ``ca_file`` (else the system's roots), and
    ``client_cert``/``client_key`` (PEM) are presented for mTLS. With ``did``
    and ``signing_key`` (a 32-byte Ed25519 seed or a ``nacl.signing.SigningKey``;
    the ``did`` extra) every request is signed for ``scd serve --auth did-wba``
    with audience ``aud``. ``timeout`` bounds each HTTP request in seconds:
    by default 610, just over the server's own limit (``scd serve
    --http-request-timeout-ms``, 600 s by default), so a long call ends with
    the server's explicit 504 rather than a cut; 429 and 503 answers are
    retried up to ``retries`` times.
    """

    def __init__(
        self,
        base_url: str,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        did: str | None = None,
        signing_key: Any = None,
        aud: str = "scd",
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
    ) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"base_url: an http:// or https:// URL, not {base_url!r}")
        if (did is None) != (signing_key is None):
            raise ValueError("did and signing_key: give both (did:wba signing) or neither")
        if (client_key is not None) and client_cert is None:
            raise ValueError("client_key: given without client_cert")
        if retries < 0:
            raise ValueError("retries: must be at least 0")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.aud = aud
        self.did = did
        self._key = None
        if did is not None:
            from . import did as _did

            self._key = _did.signing_key(signing_key)
        handlers: list[Any] = []
        if url.scheme == "https":
            ctx = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file is not None else None)
            if client_cert is not None:
                ctx.load_cert_chain(
                    os.fspath(client_cert), os.fspath(client_key) if client_key is not None else None
                )
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        elif ca_file is not None or client_cert is not None:
            raise ValueError("ca_file and client_cert: only for an https:// base_url")
        self._opener = urllib.request.build_opener(*handlers)
        self._model: str | None = None

    def __repr__(self) -> str:
        signed = f", did={self.did!r}" if self.did else ""
        return f"Client({self.base_url!r}{signed})"

    # -- transport ---------------------------------------------------------

    def _call(
        self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> Any:
        """One REST call: the answer's JSON (``None`` for an empty answer), or a :class:`ScdError`."""
        data = None if body is None else json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        attempt = 0
        while True:
            h = {"Accept": "application/json", "User-Agent": f"scd-client/{__version__}"}
            if data is not None:
                h["Content-Type"] = "application/json"
            if self._key is not None:
                from . import did as _did

                h["Authorization"] = _did.header(self._key, self.did, self.aud)
            h.update(headers or {})
            req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=h)
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                try:
                    raw = e.read()
                finally:
                    e.close()
                err = _errors.from_response(e.code, str(e.reason or ""), raw, e.headers)
                if e.code in (429, 503) and attempt < self.retries:
                    time.sleep(self._wait_s(e.headers, attempt))
                    attempt += 1
                    continue
                raise err from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                raise ScdError(
                    f"{self.base_url}: no answer ({reason})", status=None, type="connection_error"
                ) from e
            if not raw.strip():
                return None
            try:
                return json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise ScdError(f"{method} {path}: the answer is not JSON", status=200, type="api_error") from e

    @staticmethod
    def _wait_s(headers: Any, attempt: int) -> float:
        hint = _errors.retry_after_s(headers)
        if hint is None:
            hint = 0.25 * (2**attempt)
        return min(hint, _MAX_RETRY_WAIT_S)

    # -- calls ---------------------------------------------------------------

    def models(self) -> list[str]:
        """The ids of the models the server has loaded (``GET /v1/models``)."""
        r = self._call("GET", "/v1/models")
        return [m["id"] for m in r.get("data", [])]

    def openapi(self) -> dict:
        """The server's OpenAPI document (``GET /openapi.json``)."""
        return self._call("GET", "/openapi.json")

    def compress(
        self,
        task: str,
        context: Any = None,
        *,
        files: Sequence[str | os.PathLike[str]] | str | os.PathLike[str] | None = None,
        budget: int | None = None,
        rate: float | None = None,
        tokenizer: str | None = "o200k",
        **options: Any,
    ) -> Compressed:
        """The minimal sufficient context for ``task``, within ``budget`` tokens or ``rate`` of the context.

        ``context`` is a ``{"fields": [...]}`` dict, a list of field dicts
        (``name``, ``kind``, ``content``, ``confidential``), a list of texts
        (fields ``doc-0``, ``doc-1``, … of kind prose) or one text (the field
        ``context``); or give ``files`` instead: files and folders, each text
        file a field named by its path, its kind from its extension.
        ``budget`` counts tokens of ``tokenizer`` (``o200k``, ``cl100k`` or
        ``e5``; ``None``: the server's default); ``rate`` in (0, 1] keeps that
        share of the context's tokens. ``options`` go to the server as they
        are (``required``, ``optional``, ``threshold``, ``min_relative_score``,
        ``render``, ``explain``, ``reserve``, ``list_dropped``, ``session``).
        """
        if not isinstance(task, str):
            raise TypeError("task: must be a str")
        if (budget is None) == (rate is None):
            raise ValueError("budget and rate: give exactly one (budget in tokens, or rate in (0, 1])")
        if (context is None) == (files is None):
            raise ValueError("context and files: give exactly one")
        if "budget_tokenizer" in options:
            raise ValueError("budget_tokenizer: pass it as tokenizer=")
        if files is not None:
            if isinstance(files, (str, os.PathLike)):
                files = [files]
            fields = fields_from_files(files)
        else:
            fields = _fields(context)
        body: dict[str, Any] = {"task": task, "context": {"fields": fields}}
        if budget is not None:
            body["budget"] = budget
        else:
            body["rate"] = rate
        if tokenizer is not None:
            body["budget_tokenizer"] = tokenizer
        body.update({k: v for k, v in options.items() if v is not None})
        contents = {
            f["name"]: f["content"].encode("utf-8")
            for f in fields
            if isinstance(f, Mapping)
            and isinstance(f.get("name"), str)
            and isinstance(f.get("content"), str)
            and not f.get("confidential")
        }
        return Compressed(self, self._call("POST", "/v1/compress", body), contents)

    def embed(self, texts: str | Sequence[str], *, query: bool = False, model: str | None = None) -> list[list[float]]:
        """L2-normalized E5 embeddings of ``texts``, in order (``query=True``: E5's query prefix).

        ``model`` defaults to the first model ``GET /v1/models`` lists.
        """
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            return []
        if model is None:
            if self._model is None:
                ids = self.models()
                if not ids:
                    raise ScdError("GET /v1/models: the server lists no model", status=200)
                self._model = ids[0]
            model = self._model
        out: list[list[float]] = []
        for i in range(0, len(items), _EMBED_BATCH):
            body = {
                "model": model,
                "input": items[i : i + _EMBED_BATCH],
                "encoding_format": "base64",
                "input_type": "query" if query else "passage",
            }
            r = self._call("POST", "/v1/embeddings", body)
            out.extend(_vector(d["embedding"]) for d in sorted(r["data"], key=lambda d: d["index"]))
        return out
