"""did:wba request signing for ``scd serve --auth did-wba`` (the ``did`` extra: PyNaCl).

Every request carries a fresh ``Authorization: DIDWba …`` header: a random
nonce and the current UTC time, and an Ed25519 signature over the canonical
JSON ``{"aud", "did", "nonce", "timestamp"}`` (sorted keys, compact
separators), base64url without padding. The server admits a DID whose
document is in its ``--did-dir``; :func:`document` and :func:`document_path`
write one::

    import json, os, nacl.signing
    from scd_client import Client, did

    key = nacl.signing.SigningKey.generate()
    name = "did:wba:example.com:agents:me"
    path = did.document_path("/srv/scd/dids", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(did.document(name, bytes(key.verify_key)), f)
    client = Client("http://127.0.0.1:9090", did=name, signing_key=key)
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import secrets
from typing import Any

#: The fragment of the verification method the header names (``<did>#key-1``).
KEY_ID = "key-1"

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58[r])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def signing_key(key: Any) -> Any:
    """A ``nacl.signing.SigningKey`` from a 32-byte Ed25519 seed, or ``key`` itself if it is one."""
    try:
        import nacl.signing
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("did:wba signing needs PyNaCl: pip install 'scd-client[did]'") from e
    if isinstance(key, nacl.signing.SigningKey):
        return key
    if isinstance(key, (bytes, bytearray)):
        if len(key) != 32:
            raise ValueError(f"signing_key: an Ed25519 seed is 32 bytes, not {len(key)}")
        return nacl.signing.SigningKey(bytes(key))
    raise TypeError("signing_key: 32 seed bytes or a nacl.signing.SigningKey")


def document(did: str, public_key: bytes) -> dict:
    """The did:wba document that lists ``public_key`` (32 bytes) as ``<did>#key-1``."""
    method = f"{did}#{KEY_ID}"
    return {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "verificationMethod": [
            {
                "id": method,
                "type": "Ed25519VerificationKey2020",
                "controller": did,
                # multibase: "z" + base58btc(multicodec ed25519-pub 0xed 0x01 || key)
                "publicKeyMultibase": "z" + _b58encode(b"\xed\x01" + bytes(public_key)),
            }
        ],
        "authentication": [method],
    }


def document_path(did_dir: str | os.PathLike[str], did: str) -> str:
    """Where ``did``'s document goes under a server's ``--did-dir``.

    ``did:wba:host:a:b`` -> ``<did_dir>/host/a/b/did.json`` (the did:wba path rule).
    """
    if not did.startswith("did:wba:"):
        raise ValueError("did: must start with did:wba:")
    segments = did[len("did:wba:"):].split(":")
    return os.path.join(os.fspath(did_dir), *segments, "did.json")


def header(key: Any, did: str, aud: str) -> str:
    """A fresh ``Authorization`` value for one request, signed by ``key`` (a SigningKey)."""
    nonce = secrets.token_hex(16)
    timestamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    payload = json.dumps(
        {"nonce": nonce, "timestamp": timestamp, "aud": aud, "did": did}, sort_keys=True, separators=(",", ":")
    ).encode()
    sig = base64.urlsafe_b64encode(key.sign(payload).signature).rstrip(b"=").decode()
    return (
        f'DIDWba did="{did}", nonce="{nonce}", timestamp="{timestamp}", '
        f'verification_method="{KEY_ID}", signature="{sig}"'
    )
