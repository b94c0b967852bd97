"""The client over TLS and mTLS: `scd serve --tls-cert --tls-key --client-ca` (certificates made
here with the openssl command)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import pytest

import scd_client
from conftest import TASK, start_server, stop, unavailable


def make_certs(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all P-256."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=scd-test-ca")
    for name, ext in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ]:
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n" + ext)
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


@pytest.fixture(scope="module")
def mtls_server():
    if shutil.which("openssl") is None:
        unavailable("no openssl command to make test certificates")
    with tempfile.TemporaryDirectory(prefix="scd-py-client-tls-") as d:
        d = Path(d)
        make_certs(d)
        ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
        ctx.load_cert_chain(str(d / "client.pem"), str(d / "client.key"))
        s = start_server(d, "--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key"),
                         "--client-ca", str(d / "ca.pem"), ssl_context=ctx)
        try:
            yield s, d
        finally:
            stop(s)


def test_mtls_client_works(mtls_server, agent_context):
    s, d = mtls_server
    assert s.url.startswith("https://")
    c = scd_client.Client(s.url, ca_file=d / "ca.pem", client_cert=d / "client.pem", client_key=d / "client.key")
    r = c.compress(TASK, agent_context, budget=80)
    assert r.text and r.sent_tokens <= 80
    assert r.more("which table stores charges?", 0.2).chunks
    assert len(c.embed(["hello"])[0]) > 0


def test_without_a_client_certificate_the_handshake_fails(mtls_server):
    s, d = mtls_server
    with pytest.raises(scd_client.ScdError) as e:
        scd_client.Client(s.url, ca_file=d / "ca.pem").models()
    assert e.value.status is None


def test_an_unknown_server_certificate_is_refused(mtls_server):
    s, d = mtls_server
    with pytest.raises(scd_client.ScdError) as e:
        scd_client.Client(s.url, client_cert=d / "client.pem", client_key=d / "client.key").models()
    assert e.value.status is None and "CERTIFICATE_VERIFY_FAILED" in e.value.message
