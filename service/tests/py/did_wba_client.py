"""An independent DIDWba client for `scd serve --auth did-wba`.

Makes its own Ed25519 key (PyNaCl), writes its did:wba document into the
server's DID directory, builds the canonical JSON payload itself with
json.dumps(sort_keys=True, separators=(",", ":")), signs it, and calls
scd.v1.Scd/Info over grpcio with stubs generated from proto/scd/v1/scd.proto
by grpc_tools.protoc. Nothing here comes from the Rust code.

Usage: did_wba_client.py HOST:PORT DID_DIR [AUD]
Prints one JSON line per check ({"check", "ok", "detail"}); exits 1 when any
check fails, 2 on a set-up error.
"""

import base64
import datetime
import importlib
import json
import os
import secrets
import sys
import tempfile

import grpc
import nacl.signing
from grpc_tools import protoc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PROTO_DIR = os.path.join(ROOT, "proto")
DID = "did:wba:py.example:agents:probe"
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(B58[r])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def document(did: str, public_key: bytes) -> dict:
    method = f"{did}#key-1"
    return {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "verificationMethod": [{
            "id": method,
            "type": "Ed25519VerificationKey2020",
            "controller": did,
            # multibase: "z" + base58btc(multicodec ed25519-pub 0xed 0x01 || key)
            "publicKeyMultibase": "z" + b58encode(b"\xed\x01" + public_key),
        }],
        "authentication": [method],
    }


def document_path(did_dir: str, did: str) -> str:
    # did:wba:host:a:b -> <dir>/host/a/b/did.json (the did:wba path rule)
    segments = did[len("did:wba:"):].split(":")
    return os.path.join(did_dir, *segments, "did.json")


def header(key: nacl.signing.SigningKey, did: str, aud: str, tamper: bool = False) -> str:
    nonce = secrets.token_hex(16)
    timestamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    payload = json.dumps(
        {"nonce": nonce, "timestamp": timestamp, "aud": aud, "did": did}, sort_keys=True, separators=(",", ":")
    ).encode()
    signature = bytearray(key.sign(payload).signature)
    if tamper:
        signature[0] ^= 1
    sig = base64.urlsafe_b64encode(bytes(signature)).rstrip(b"=").decode()
    return (f'DIDWba did="{did}", nonce="{nonce}", timestamp="{timestamp}", '
            f'verification_method="key-1", signature="{sig}"')


def stubs():
    out = tempfile.mkdtemp(prefix="scd-py-stubs-")
    args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--grpc_python_out={out}",
            os.path.join(PROTO_DIR, "scd", "v1", "scd.proto")]
    if protoc.main(args) != 0:
        raise SystemExit(2)
    sys.path.insert(0, out)
    return importlib.import_module("scd.v1.scd_pb2"), importlib.import_module("scd.v1.scd_pb2_grpc")


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    addr, did_dir = sys.argv[1], sys.argv[2]
    aud = sys.argv[3] if len(sys.argv) == 4 else "scd"
    pb, pb_grpc = stubs()
    key = nacl.signing.SigningKey.generate()
    path = document_path(did_dir, DID)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(document(DID, bytes(key.verify_key)), f)
    failed = 0

    def report(check: str, ok: bool, detail) -> None:
        nonlocal failed
        failed += 0 if ok else 1
        print(json.dumps({"check": check, "ok": ok, "detail": detail}), flush=True)

    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.ScdStub(channel)
        try:
            info = stub.Info(pb.InfoRequest(), metadata=[("authorization", header(key, DID, aud))], timeout=10)
            report("signed_info_answered", True, {"model": info.model, "dim": info.dim})
        except grpc.RpcError as e:
            report("signed_info_answered", False, {"code": str(e.code()), "message": e.details()})
        try:
            stub.Info(pb.InfoRequest(), metadata=[("authorization", header(key, DID, aud, tamper=True))], timeout=10)
            report("tampered_signature_refused", False, "accepted")
        except grpc.RpcError as e:
            ok = e.code() == grpc.StatusCode.UNAUTHENTICATED and e.details().startswith("bad signature")
            report("tampered_signature_refused", ok, {"code": str(e.code()), "message": e.details()})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
