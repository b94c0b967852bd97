"""A server under `--auth did-wba`: a signed client works, an unsigned or wrongly signed one is refused."""

from __future__ import annotations

import pytest

import scd_client
from conftest import TASK, need


def test_signed_client_works(did_server, agent_context):
    c = scd_client.Client(did_server.url, did=did_server.did, signing_key=did_server.seed)
    r = c.compress(TASK, agent_context, budget=80)
    assert r.text and r.sent_tokens <= 80
    m = r.more("which table stores charges?", 0.2)
    assert not {x.id for x in m.chunks} & {x.id for x in r.chunks}
    assert len(c.embed(["hello"])[0]) > 0
    r.close()


def test_a_signing_key_object_works_too(did_server):
    nacl_signing = need("nacl.signing")
    c = scd_client.Client(did_server.url, did=did_server.did, signing_key=nacl_signing.SigningKey(did_server.seed))
    assert c.models()


def test_unsigned_client_is_refused(did_server, agent_context):
    c = scd_client.Client(did_server.url)
    with pytest.raises(scd_client.AuthError) as e:
        c.compress(TASK, agent_context, budget=80)
    assert e.value.status == 401
    with pytest.raises(scd_client.AuthError):
        c.models()


def test_another_key_is_refused(did_server):
    c = scd_client.Client(did_server.url, did=did_server.did, signing_key=bytes(32))
    with pytest.raises(scd_client.AuthError) as e:
        c.models()
    assert e.value.status == 401


def test_another_audience_is_refused(did_server):
    c = scd_client.Client(did_server.url, did=did_server.did, signing_key=did_server.seed, aud="not-scd")
    with pytest.raises(scd_client.AuthError):
        c.models()
