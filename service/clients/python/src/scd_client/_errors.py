"""The errors a call raises: one class per kind of HTTP status the server answers.

Every server error is OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``; :class:`ScdError` carries those fields verbatim, so the message a
caller sees is the server's (it names the field and the limit, never a value).
"""

from __future__ import annotations

import json
from typing import Any, Mapping


class ScdError(Exception):
    """An SCD call that failed.

    ``status`` is the HTTP status (``None`` when no answer came: the server
    could not be reached), ``message`` the server's message verbatim,
    ``param`` the field at fault (a JSON path such as ``budget`` or
    ``context.fields[2].kind``) if any, ``type`` OpenAI's error type
    (``invalid_request_error``, ``authentication_error``, …) and ``code`` the
    server's gRPC code name (``INVALID_ARGUMENT``, …).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        type: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code

    def __str__(self) -> str:
        return self.message if self.status is None else f"{self.status}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={self.message!r}, param={self.param!r})"


class InvalidRequest(ScdError):
    """400 (invalid input: ``param`` names the field) or 413 (body too large)."""


class AuthError(ScdError):
    """401 (not authenticated, or a session call without its token) or 403."""


class NotFound(ScdError):
    """404: no such session (expired or closed) or model."""


class Busy(ScdError):
    """429: the server is busy; ``retry_after_s`` is its hint, in seconds."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class Unavailable(ScdError):
    """503: the engine is unavailable (starting, draining, or its encoder stopped)."""


_BY_STATUS: dict[int, type[ScdError]] = {
    400: InvalidRequest,
    413: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    429: Busy,
    503: Unavailable,
}


def retry_after_s(headers: Mapping[str, str] | Any) -> float | None:
    """The server's retry hint in seconds: ``retry-after-ms`` if sent, else ``Retry-After``."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    s = headers.get("Retry-After")
    if s is not None:
        try:
            return max(0.0, float(s))
        except ValueError:
            # an HTTP date: not what this server sends; no hint
            return None
    return None


def from_response(status: int, reason: str, body: bytes, headers: Mapping[str, str] | Any) -> ScdError:
    """The error an HTTP answer of ``status`` with ``body`` stands for."""
    detail: dict[str, Any] = {}
    try:
        parsed = json.loads(body.decode("utf-8"))
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            detail = parsed["error"]
    except (UnicodeDecodeError, ValueError):
        pass
    message = detail.get("message")
    if not isinstance(message, str) or not message:
        # not the server's shape (a proxy, or a route that does not exist)
        text = body.decode("utf-8", errors="replace").strip()
        message = text[:500] if text else (reason or f"HTTP {status}")
    cls = _BY_STATUS.get(status, ScdError)
    kw: dict[str, Any] = {
        "status": status,
        "param": detail.get("param"),
        "type": detail.get("type"),
        "code": detail.get("code"),
    }
    if cls is Busy:
        return Busy(message, retry_after_s=retry_after_s(headers), **kw)
    return cls(message, **kw)
