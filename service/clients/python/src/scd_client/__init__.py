"""A client of SCD's REST API: the minimal sufficient context for a task under a token budget.

Three lines against a server at ``$SCD_URL`` (default ``http://127.0.0.1:9090``,
the address of ``scd serve --http-addr``)::

    import scd_client
    r = scd_client.compress("Why do charges fail?", files=["service/src/grpc/"], budget=1500, tokenizer="o200k")
    print(r.text)   # within 1,500 o200k tokens; r.more("which table stores charges?") asks for the next chunks

:class:`Client` is the whole API (TLS, mTLS, did:wba signing, retries);
:mod:`scd_client.langchain` and :mod:`scd_client.llamaindex` adapt it to
LangChain and LlamaIndex. Errors are :class:`ScdError` and its subclasses.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ._client import SESSION_TOKEN_HEADER, Chunk, Client, Compressed, More, __version__
from ._errors import AuthError, Busy, InvalidRequest, NotFound, ScdError, Unavailable
from ._files import kind_of

__all__ = [
    "AuthError",
    "Busy",
    "Chunk",
    "Client",
    "Compressed",
    "InvalidRequest",
    "More",
    "NotFound",
    "SESSION_TOKEN_HEADER",
    "ScdError",
    "Unavailable",
    "compress",
    "embed",
    "kind_of",
    "__version__",
]

#: The server the module-level functions call when ``SCD_URL`` is not set.
DEFAULT_URL = "http://127.0.0.1:9090"

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def _default() -> Client:
    url = os.environ.get("SCD_URL", DEFAULT_URL)
    with _lock:
        c = _clients.get(url)
        if c is None:
            c = _clients[url] = Client(url)
        return c


def compress(task: str, context: Any = None, **kwargs: Any) -> Compressed:
    """:meth:`Client.compress` on ``Client(os.environ.get("SCD_URL", "http://127.0.0.1:9090"))``."""
    return _default().compress(task, context, **kwargs)


def embed(texts: Any, **kwargs: Any) -> list[list[float]]:
    """:meth:`Client.embed` on ``Client(os.environ.get("SCD_URL", "http://127.0.0.1:9090"))``."""
    return _default().embed(texts, **kwargs)
