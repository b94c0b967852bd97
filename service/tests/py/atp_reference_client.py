"""An independent ATP client built from the REFERENCE protos, run against an agent.

Generates Python code from the vendored reference protos
(service/tests/atp-reference, AgentTransportProtocol proto/atp/v1 at 3dec720)
into a temp dir with grpc_tools.protoc, makes its own did:key (Ed25519, PyNaCl,
base58btc written here), and checks the agent's handshake and authentication
over the wire. The agent must run with
`--capability code_generation:0.9:800:0.02`.

Usage: atp_reference_client.py HOST:PORT AGENT_DID
Prints one JSON line per check ({"check", "ok", "detail"}); exits 1 when any
check fails, 2 on a usage or set-up error.

What a reference client cannot do: the reference protos lack the `signature`
(and `nonce`) fields SCD added to Heartbeat, Backpressure, CircuitBreak,
ContextRequest, TaskSubmit, TaskQuery and ContractAck, so such a client cannot
sign those messages, and SCD refuses them unsigned (see the heartbeat check).
Of the client's messages only CapabilityProbe has both `nonce` and `signature`
in the reference; ContractAccept and InteractionProof have `signature` but no
`nonce` (SCD added it), so only the probe is fully signable by a reference
client, and that is what the checks below exercise.
"""

import importlib
import json
import os
import secrets
import sys
import tempfile
import time

import grpc
import nacl.exceptions
import nacl.signing
from grpc_tools import protoc

REFERENCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "atp-reference"))
TIMEOUT_S = 10

# ---------------------------------------------------------------------------
# did:key (Ed25519): "did:key:z" + base58btc(0xed 0x01 || 32-byte public key)
# ---------------------------------------------------------------------------

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
ED25519_PUB = b"\xed\x01"  # multicodec ed25519-pub, varint-encoded


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(B58[r])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    n = 0
    for c in text:
        i = B58.find(c)
        if i < 0:
            raise ValueError(f"{c!r} is not a base58btc character")
        n = n * 58 + i
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * zeros + body


def did_key(public_key: bytes) -> str:
    return "did:key:z" + b58encode(ED25519_PUB + public_key)


def parse_did_key(did: str) -> nacl.signing.VerifyKey:
    if not did.startswith("did:key:z"):
        raise ValueError(f"{did!r} is not a base58btc did:key")
    raw = b58decode(did[len("did:key:z"):])
    if raw[:2] != ED25519_PUB or len(raw) != 34:
        raise ValueError(f"{did!r} is not an Ed25519 did:key (prefix {raw[:2].hex()}, {len(raw)} bytes)")
    return nacl.signing.VerifyKey(raw[2:])


def self_test() -> None:
    # draft-msporny-base58 test vectors
    assert b58encode(b"Hello World!") == "2NEpo7TZRRrLZSi2U", b58encode(b"Hello World!")
    assert b58encode(bytes.fromhex("0000287fb4cd")) == "11233QC4", b58encode(bytes.fromhex("0000287fb4cd"))
    for data in (b"", b"\0", b"\0\0\1", secrets.token_bytes(34)):
        assert b58decode(b58encode(data)) == data, data.hex()
    key = nacl.signing.SigningKey.generate()
    did = did_key(bytes(key.verify_key))
    assert did.startswith("did:key:z6Mk"), did  # every Ed25519 did:key does
    assert bytes(parse_did_key(did)) == bytes(key.verify_key)


# ---------------------------------------------------------------------------
# code from the reference protos
# ---------------------------------------------------------------------------


def generate(out_dir: str):
    files = sorted(f"atp/v1/{f}" for f in os.listdir(os.path.join(REFERENCE, "atp", "v1")) if f.endswith(".proto"))
    args = ["grpc_tools.protoc", f"-I{REFERENCE}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {REFERENCE}")
    sys.path.insert(0, out_dir)
    mods = {}
    for name in ("common_pb2", "handshake_pb2", "fault_pb2", "routing_pb2", "service_pb2_grpc"):
        mods[name] = importlib.import_module(f"atp.v1.{name}")
    if not mods["handshake_pb2"].__file__.startswith(out_dir):
        raise SystemExit(f"imported atp.v1 from {mods['handshake_pb2'].__file__}, not the generated {out_dir}")
    return mods


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


class Client:
    def __init__(self, addr: str, agent_did: str, mods):
        self.pb = mods["common_pb2"]
        self.hs = mods["handshake_pb2"]
        self.fault = mods["fault_pb2"]
        self.routing = mods["routing_pb2"]
        self.channel = grpc.insecure_channel(addr)
        grpc.channel_ready_future(self.channel).result(timeout=TIMEOUT_S)
        self.stub = mods["service_pb2_grpc"].AtpServiceStub(self.channel)
        self.agent_did = agent_did
        self.key = nacl.signing.SigningKey.generate()
        self.did = did_key(bytes(self.key.verify_key))
        self.failed = 0

    def report(self, check: str, ok: bool, detail) -> None:
        print(json.dumps({"check": check, "ok": ok, "detail": detail}), flush=True)
        if not ok:
            self.failed += 1

    @staticmethod
    def signing_bytes(msg) -> bytes:
        m = type(msg)()
        m.CopyFrom(msg)
        m.ClearField("signature")
        # SCD's signing rule: the type tag (full name, a zero byte), then the
        # deterministic encoding with the signature cleared
        return msg.DESCRIPTOR.full_name.encode() + b"\0" + m.SerializeToString(deterministic=True)

    def sign(self, msg, key=None) -> None:
        msg.signature = (key or self.key).sign(self.signing_bytes(msg)).signature

    def now(self, skew_s: float = 0.0):
        t = time.time() + skew_s
        return self.pb.Timestamp(seconds=int(t), nanos=int((t % 1) * 1e9))

    def probe(self, signed: bool = True, skew_s: float = 0.0):
        p = self.hs.CapabilityProbe()
        getattr(p, "from").uuid = self.did  # `from` is a Python keyword
        p.task_type = self.pb.TASK_TYPE_CODE_GENERATION
        p.qos.min_quality = 0.5
        p.qos.max_latency_ms = 5000
        p.qos.max_cost = 1.0
        p.qos.min_trust = 0.0
        p.nonce = secrets.randbits(64) or 1
        p.timestamp.CopyFrom(self.now(skew_s))
        if signed:
            self.sign(p)
        return p

    def expect_refusal(self, check: str, call, msg, want: str) -> None:
        try:
            reply = call(msg, timeout=TIMEOUT_S)
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
            ok = code == grpc.StatusCode.UNAUTHENTICATED and want in details
            self.report(check, ok, {"code": code.name, "details": details, "want": f"UNAUTHENTICATED containing {want!r}"})
            return
        self.report(check, False, {"unexpected_reply": str(reply), "want": f"UNAUTHENTICATED containing {want!r}"})

    def good_probe(self):
        probe = self.probe()
        try:
            offer = self.stub.Probe(probe, timeout=TIMEOUT_S)
        except grpc.RpcError as e:
            self.report("good_probe_gets_signed_offer", False, {"code": e.code().name, "details": e.details()})
            return probe
        problems = []
        sender = getattr(offer, "from").uuid
        if sender != self.agent_did:
            problems.append(f"from.uuid {sender!r}, want {self.agent_did!r}")
        if offer.in_reply_to != probe.nonce:
            problems.append(f"in_reply_to {offer.in_reply_to}, want the probe's nonce {probe.nonce}")
        cap = offer.capability
        if cap.task_type != self.pb.TASK_TYPE_CODE_GENERATION:
            problems.append(f"capability.task_type {self.pb.TaskType.Name(cap.task_type)}")
        if abs(cap.estimated_quality - 0.9) > 1e-9:
            problems.append(f"capability.estimated_quality {cap.estimated_quality}, want 0.9")
        if cap.estimated_latency_ms != 800:
            problems.append(f"capability.estimated_latency_ms {cap.estimated_latency_ms}, want 800")
        if abs(cap.cost_per_task - 0.02) > 1e-9:
            problems.append(f"capability.cost_per_task {cap.cost_per_task}, want 0.02")
        if not offer.HasField("timestamp") or abs(offer.timestamp.seconds - time.time()) > 60:
            problems.append(f"timestamp {offer.timestamp.seconds} not within 60 s of now")
        # The offer carries SCD's fields (nonce 9, context_requirements 10,
        # trust_evidence 11, task_id 12) that the reference lacks: Python keeps
        # them as unknown fields and writes them after the known ones (1..8),
        # which is number order again, so the bytes equal the signer's.
        unknown = sorted({f.field_number for f in _unknown_fields(offer)})
        signed = self.signing_bytes(offer)
        verified = False
        try:
            parse_did_key(self.agent_did).verify(signed, offer.signature)
            verified = True
        except (nacl.exceptions.BadSignatureError, ValueError) as e:
            problems.append(f"signature does not verify over the deterministic re-encoding ({type(e).__name__}: {e}); "
                            f"{len(offer.signature)}-byte signature, {len(signed)} signed bytes, unknown fields {unknown}")
        self.report(
            "good_probe_gets_signed_offer",
            not problems,
            {
                "problems": problems,
                "in_reply_to": str(offer.in_reply_to),
                "capability": [self.pb.TaskType.Name(cap.task_type), cap.estimated_quality, cap.estimated_latency_ms, cap.cost_per_task],
                "trust_score": offer.trust_score,
                "signature_verified": verified,
                "unknown_fields_kept": unknown,
            },
        )
        return probe

    def run(self) -> int:
        self.report("client_identity", True, {"did": self.did, "agent": self.agent_did})
        good = self.good_probe()

        self.expect_refusal("unsigned_probe_refused", self.stub.Probe, self.probe(signed=False), "unsigned")

        tampered = self.probe()
        tampered.qos.min_quality = 0.1  # after signing
        self.expect_refusal("tampered_probe_refused", self.stub.Probe, tampered, "does not verify")

        other = self.probe(signed=False)
        self.sign(other, key=nacl.signing.SigningKey.generate())  # `from` still names our DID
        self.expect_refusal("probe_signed_by_another_key_refused", self.stub.Probe, other, "does not verify")

        self.expect_refusal("stale_probe_refused", self.stub.Probe, self.probe(skew_s=-120), "stale")

        self.expect_refusal("replayed_probe_refused", self.stub.Probe, good, "replayed")

        # The reference Heartbeat has no signature field (SCD added it as
        # field 10), so a reference client can only send it unsigned.
        hb = self.fault.Heartbeat(sequence=1, queue_depth=0, load_factor=0.1)
        getattr(hb, "from").uuid = self.did
        hb.timestamp.CopyFrom(self.now())
        self.expect_refusal("reference_heartbeat_unsigned_refused", self.stub.SendHeartbeat, hb, "unsigned")

        # Nor has the reference RouteQuery (SCD signs it, fields 6-9): an
        # unsigned one is refused, as routes tell what the agent knows of its peers.
        q = self.routing.RouteQuery(task_type=self.pb.TASK_TYPE_CODE_GENERATION, max_routes=3)
        q.qos.min_quality = 0.5
        q.qos.max_latency_ms = 5000
        q.qos.max_cost = 1.0
        self.expect_refusal("reference_route_query_unsigned_refused", self.stub.QueryRoute, q, "unsigned")

        self.channel.close()
        return 1 if self.failed else 0


def _unknown_fields(msg):
    from google.protobuf import unknown_fields

    return unknown_fields.UnknownFieldSet(msg)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    addr, agent_did = sys.argv[1], sys.argv[2]
    self_test()
    try:
        parse_did_key(agent_did)  # a bad AGENT_DID is a usage error, not a check
    except ValueError as e:
        print(f"AGENT_DID: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="atp-ref-client-") as tmp:
        mods = generate(tmp)
        try:
            client = Client(addr, agent_did, mods)
        except grpc.FutureTimeoutError:
            print(f"{addr}: no gRPC connection within {TIMEOUT_S} s", file=sys.stderr)
            return 2
        return client.run()


if __name__ == "__main__":
    sys.exit(main())
