"""Fixtures: real `scd serve` processes on 127.0.0.1:0 and what the tests send them.

The binary is $SCD_BIN (default <repo>/target/debug/scd), with
$SCD_MODELS_DIR (default <repo>/models/out) and $SCD_ORT_LIB (default
<repo>/.tools/ort/libonnxruntime.so). When one is missing the server tests
skip, saying why; under CI=true they fail instead.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
FIXTURE = ROOT / "fixtures" / "agent_context.json"
START_TIMEOUT_S = 120.0
TASK = "Why do charges fail?"
SECRET = "sk_live_SECRET_4242"
# the evidence a receiver needs for TASK (fixtures/agent_context_gold.json)
EVIDENCE = ("connection pool exhausted", "cannot get a database connection")


def unavailable(reason: str) -> None:
    """A missing prerequisite: a failure under CI=true or SCD_REQUIRE_MODELS=1 (as `make test` runs), else a skip."""
    if os.environ.get("CI") == "true" or os.environ.get("SCD_REQUIRE_MODELS") == "1":
        pytest.fail(f"{reason} (CI=true or SCD_REQUIRE_MODELS=1: not skipping)", pytrace=False)
    pytest.skip(reason)


def need(module: str):
    """`module`, imported; missing, a failure under CI=true, else a skip."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable(f"{module} is not installed ({e}): service/tests/setup.sh makes .tools/py-client-venv")


@dataclass
class Server:
    url: str
    grpc_addr: str
    proc: subprocess.Popen
    stderr_path: Path

    def stderr_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def paths() -> tuple[Path, Path, Path]:
    """The scd binary, the models folder and the ONNX Runtime library (each checked)."""
    return _paths()


def _paths() -> tuple[Path, Path, Path]:
    binary = Path(os.environ.get("SCD_BIN", ROOT / "target" / "debug" / "scd"))
    models = Path(os.environ.get("SCD_MODELS_DIR", ROOT / "models" / "out"))
    ort = Path(os.environ.get("SCD_ORT_LIB", ROOT / ".tools" / "ort" / "libonnxruntime.so"))
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        unavailable(f"no scd binary at {binary} (cargo build -p scd-service, or set SCD_BIN)")
    if not (models / "e5-small").is_dir():
        unavailable(f"no model {models / 'e5-small'} (models/setup.sh, or set SCD_MODELS_DIR)")
    if not ort.is_file():
        unavailable(f"no ONNX Runtime library at {ort} (models/setup.sh, or set SCD_ORT_LIB)")
    return binary, models, ort


def start_server(workdir: Path, *extra: str, ssl_context=None) -> Server:
    """`scd serve` on free ports in `workdir`, once GET /v1/models answers (any HTTP status;
    over TLS with `ssl_context`)."""
    binary, models, ort = _paths()
    env = dict(os.environ, SCD_MODELS_DIR=str(models), SCD_ORT_LIB=str(ort))
    stderr_path = workdir / "stderr.log"
    args = [
        str(binary), "serve", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
        "--embedding-cache", str(workdir / "embeddings.redb"), *extra,
    ]
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    # read on to the end, so the server never blocks on a full pipe
    def read() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    url = grpc = None
    server = Server("", "", proc, stderr_path)

    def give_up(why: str) -> None:
        stop(server)
        pytest.fail(f"scd serve {' '.join(extra)}: {why}\n--- stderr ---\n{server.stderr_tail()}", pytrace=False)

    while url is None or grpc is None:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            give_up(f"printed no HTTP and gRPC addresses within {START_TIMEOUT_S:.0f} s")
        if line is None:
            give_up(f"exited ({proc.wait()}) before printing its addresses")
        if line.startswith("metrics on ") and line.endswith("/metrics"):
            url = line[len("metrics on "):-len("/metrics")]
        elif line.startswith("listening on "):
            grpc = line[len("listening on "):]
    server.url, server.grpc_addr = url, grpc
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5, context=ssl_context):
                break
        except urllib.error.HTTPError:
            break  # an answer (401 under --auth did-wba)
        except OSError:
            pass
        if proc.poll() is not None:
            give_up(f"exited ({proc.returncode}) before GET /v1/models answered")
        if time.monotonic() > deadline:
            give_up(f"GET /v1/models did not answer within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    return server


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory(prefix="scd-py-client-") as d:
        s = start_server(Path(d))
        try:
            yield s
        finally:
            stop(s)


@pytest.fixture(scope="session")
def url(server) -> str:
    return server.url


@pytest.fixture
def client(url):
    import scd_client

    return scd_client.Client(url)


@pytest.fixture(scope="session")
def agent_context() -> dict:
    with open(FIXTURE) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def o200k():
    """tiktoken's o200k_base, read from the copy llama-index-core ships (nothing is downloaded)."""
    try:
        import llama_index.core
        import tiktoken
    except ImportError as e:
        unavailable(f"tiktoken or llama-index-core is not installed ({e}): service/tests/setup.sh")
    cache = Path(llama_index.core.__file__).parent / "_static" / "tiktoken_cache"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        return tiktoken.get_encoding("o200k_base")
    except Exception as e:  # a download attempt fails: no network here
        unavailable(f"o200k_base is not in {cache}: {e}")


# -- did:wba, written here without the package's helpers ---------------------

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
DID = "did:wba:py-client.example:agents:tester"


def b58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def did_document(did: str, public_key: bytes) -> dict:
    method = f"{did}#key-1"
    return {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": did,
        "verificationMethod": [{
            "id": method,
            "type": "Ed25519VerificationKey2020",
            "controller": did,
            "publicKeyMultibase": "z" + b58(b"\xed\x01" + public_key),
        }],
        "authentication": [method],
    }


@dataclass
class DidServer:
    server: Server
    did: str
    seed: bytes

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="session")
def did_server():
    try:
        import nacl.signing
    except ImportError:
        unavailable("PyNaCl is not installed (the did extra): service/tests/setup.sh")
    seed = bytes(range(1, 33))
    key = nacl.signing.SigningKey(seed)
    with tempfile.TemporaryDirectory(prefix="scd-py-client-did-") as d:
        did_dir = Path(d) / "dids"
        path = did_dir.joinpath(*DID[len("did:wba:"):].split(":"), "did.json")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(did_document(DID, bytes(key.verify_key))))
        s = start_server(Path(d), "--auth", "did-wba", "--did-dir", str(did_dir), "--auth-aud", "scd")
        try:
            yield DidServer(s, DID, seed)
        finally:
            stop(s)


def decode_base64_vector(s: str) -> list[float]:
    import array

    a = array.array("f")
    a.frombytes(base64.b64decode(s))
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()
