"""The client against a real `scd serve`: compress, more, close, errors, embed, OpenAPI."""

from __future__ import annotations

import json
import math

import pytest

import scd_client
from conftest import EVIDENCE, SECRET, TASK


def shared_fields(ctx: dict) -> list[dict]:
    return [f for f in ctx["fields"] if not f.get("confidential")]


def test_compress_with_budget(client, agent_context, o200k):
    r = client.compress(TASK, agent_context, budget=150, tokenizer="o200k")
    assert r.text.strip()
    assert r.tokenizer == "o200k"
    assert 0 < r.sent_tokens <= 150
    # counted independently: the text handed over is within the budget in o200k
    assert len(o200k.encode(r.text)) <= 150
    assert r.ratio > 1 and r.origin_tokens > r.sent_tokens
    assert math.isclose(r.ratio, r.origin_tokens / r.sent_tokens)
    assert r.session_id and r.raw["session_id"] == r.session_id
    assert r.chunks
    names = {f["name"]: f["content"] for f in shared_fields(agent_context)}
    for c in r.chunks:
        assert c.field in names and c.text is not None and c.tokens > 0
        assert names[c.field].encode()[c.span[0]:c.span[1]].decode() == c.text
        assert c.text.strip() in r.text
    assert any(e in r.text for e in EVIDENCE), r.text


def test_compress_with_rate(client, agent_context, o200k):
    whole = sum(len(o200k.encode(f["content"])) for f in shared_fields(agent_context))
    r = client.compress(TASK, agent_context, rate=0.3, tokenizer="o200k")
    budget = max(1, math.floor(0.3 * whole))
    assert r.text.strip() and 0 < r.sent_tokens <= budget
    assert len(o200k.encode(r.text)) <= budget
    assert math.isclose(r.raw["totals"]["requested_ratio"], r.origin_tokens / budget, rel_tol=1e-3)


def test_compress_with_every_context_shape(client):
    texts = ["The charges table stores every card charge.", "Charges fail when the pool is exhausted."]
    for ctx in (texts, " ".join(texts), [{"name": "a", "content": texts[0]}, {"name": "b", "content": texts[1]}]):
        r = client.compress(TASK, ctx, budget=200, tokenizer=None)
        assert r.text.strip() and r.tokenizer == "e5"
    assert {c.field for c in client.compress(TASK, texts, budget=200).chunks} <= {"doc-0", "doc-1"}


def test_compress_from_files(client, tmp_path):
    d = tmp_path / "proj"
    d.mkdir()
    code = (
        "def charge_card(pool, order):\n"
        "    conn = pool.acquire(timeout=5)  # raises PoolExhausted when all 32 connections are busy\n"
        "    return conn.execute('INSERT INTO charges VALUES (%s)', order)\n"
    )
    notes = "# Incident notes\n\nCharges fail because the database pool is exhausted at peak.\n"
    (d / "billing.py").write_text(code)
    (d / "NOTES.md").write_text(notes)
    (d / ".env").write_text("TOKEN=do-not-send\n")
    (d / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    r = client.compress(TASK, files=[d], budget=2000)
    assert {c.field for c in r.chunks} == {f"{d}/billing.py", f"{d}/NOTES.md"}
    assert "pool.acquire" in r.text and "database pool is exhausted" in r.text
    assert "do-not-send" not in r.text


def test_confidential_field_never_comes_back(client, agent_context):
    r = client.compress("What is the payment gateway key?", agent_context, budget=5000)
    assert "api_keys" in r.withheld_fields
    assert SECRET not in r.text and SECRET not in json.dumps(r.raw)
    assert all(c.field != "api_keys" for c in r.chunks)
    m = r.more("what is the production key?", 0.0)
    assert SECRET not in m.text and SECRET not in json.dumps(m.raw)
    assert all(c.field != "api_keys" for c in m.chunks)


def test_the_session_token_stays_out_of_sight(client, agent_context):
    r = client.compress(TASK, agent_context, budget=100)
    token = r._token
    assert len(token) >= 16
    assert token not in repr(r) and token not in json.dumps(r.raw) and "session_token" not in r.raw


def test_more_returns_chunks_not_sent_before(client, agent_context):
    r = client.compress(TASK, agent_context, budget=60, tokenizer="o200k")
    sent = {c.id for c in r.chunks}
    m = r.more("which table stores charges and what columns does it have?", 0.2)
    assert isinstance(m, scd_client.More)
    assert m.chunks and m.text.strip(), m.reason
    ids = {c.id for c in m.chunks}
    assert not ids & sent
    assert all(c.text is not None and c.text.strip() in m.text for c in m.chunks)
    assert m.remaining_tokens >= 0
    m2 = r.more("what does the code do when it charges a card?", 0.2, max_tokens=200)
    assert not {c.id for c in m2.chunks} & (sent | ids)
    assert m2.chunks or m2.reason
    # asked until the context is spent: no chunk, and a reason
    seen = sent | ids | {c.id for c in m2.chunks}
    for _ in range(20):
        m = r.more("anything else about charges?", 0.0, max_tokens=500)
        assert not {c.id for c in m.chunks} & seen
        seen |= {c.id for c in m.chunks}
        if not m.chunks:
            break
    assert not m.chunks and m.reason and not m.text.strip()


def test_close_then_more_is_not_found(client, agent_context):
    r = client.compress(TASK, agent_context, budget=60)
    r.close()
    r.close()  # a second close does nothing
    with pytest.raises(scd_client.NotFound) as e:
        r.more("anything else?", 0.1)
    assert e.value.status == 404
    with client.compress(TASK, agent_context, budget=60) as r2:
        pass
    with pytest.raises(scd_client.NotFound):
        r2.more("anything else?", 0.1)


def test_budget_zero_is_invalid_naming_budget(client, agent_context):
    with pytest.raises(scd_client.InvalidRequest) as e:
        client.compress(TASK, agent_context, budget=0)
    assert (e.value.status, e.value.param, e.value.type) == (400, "budget", "invalid_request_error")
    assert e.value.message == "budget: must be at least 1"


def test_rate_out_of_range_is_invalid_naming_rate(client, agent_context):
    with pytest.raises(scd_client.InvalidRequest) as e:
        client.compress(TASK, agent_context, rate=1.5)
    assert e.value.param == "rate" and e.value.message.startswith("rate: ")


def test_unknown_key_is_invalid_naming_it(client, agent_context):
    with pytest.raises(scd_client.InvalidRequest) as e:
        client.compress(TASK, agent_context, budget=100, bogus_option=1)
    assert e.value.status == 400 and e.value.param == "bogus_option"
    assert e.value.message.startswith("bogus_option: ")


def test_bad_kind_is_invalid_naming_the_field_path(client):
    with pytest.raises(scd_client.InvalidRequest) as e:
        client.compress(TASK, [{"name": "a", "kind": "poetry", "content": "x"}], budget=100)
    assert e.value.param == "context.fields[0].kind", e.value.message
    assert "poetry" not in e.value.message


def test_both_budget_and_rate_fail_locally(client, agent_context):
    with pytest.raises(ValueError, match="budget and rate"):
        client.compress(TASK, agent_context, budget=100, rate=0.5)


def test_unknown_model_is_not_found(client):
    with pytest.raises(scd_client.NotFound) as e:
        client.embed(["x"], model="no-such-model")
    assert e.value.param == "model"


def test_embed(client):
    texts = ["charges fail when the pool is exhausted", "the newsletter font is blue"]
    v = client.embed(texts)
    assert len(v) == 2 and len(v[0]) == len(v[1]) > 0
    for x in v:
        assert math.isclose(math.sqrt(sum(a * a for a in x)), 1.0, abs_tol=1e-3)
    q = client.embed(texts, query=True)
    assert len(q[0]) == len(v[0])
    cos = sum(a * b for a, b in zip(q[0], v[0]))
    assert cos < 0.9999  # E5's query: and passage: prefixes differ
    assert client.embed(texts[0]) == [v[0]]
    assert client.embed([]) == []


def test_models_and_openapi(client):
    models = client.models()
    assert models and all(isinstance(m, str) and m for m in models)
    doc = client.openapi()
    for path in ("/v1/compress", "/v1/sessions/{session_id}/more", "/v1/sessions/{session_id}",
                 "/v1/embeddings", "/v1/models"):
        assert path in doc["paths"], path


def test_module_level_quick_start(url, monkeypatch, agent_context):
    monkeypatch.setenv("SCD_URL", url)
    r = scd_client.compress(TASK, agent_context, budget=150, tokenizer="o200k")
    assert r.text and r.sent_tokens <= 150
    assert len(scd_client.embed(["hello"])[0]) == len(scd_client.Client(url).embed("hello")[0])
