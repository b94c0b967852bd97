"""The official `openai` client on /v1/embeddings: the same vectors as `scd embed` and the package's embed."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from conftest import decode_base64_vector, paths, unavailable

TEXTS = ["charges fail when the pool is exhausted", "query: which table stores charges?", "ünïcödé text"]


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture
def oai(url):
    try:
        import openai
    except ImportError:
        unavailable("the openai package is not installed: service/tests/setup.sh")
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_models_list(oai, client):
    assert [m.id for m in oai.models.list().data] == client.models()


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_openai_embeddings_match_the_package(oai, client, encoding_format):
    model = oai.models.list().data[0].id
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    r = oai.embeddings.create(model=model, input=TEXTS, **kwargs)
    assert r.model == model and [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens > 0
    got = [decode_base64_vector(d.embedding) if isinstance(d.embedding, str) else d.embedding for d in r.data]
    if encoding_format == "base64":
        assert all(isinstance(d.embedding, str) for d in r.data)
    ours = client.embed(TEXTS)
    for a, b in zip(got, ours):
        assert len(a) == len(b)
        assert cosine(a, b) > 0.999


def test_openai_errors_are_openai_errors(oai):
    import openai

    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input=["x"])
    model = oai.models.list().data[0].id
    # token ids are taken (as OpenAI takes them); one that is no cl100k token is not
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=model, input=[[1, 2, 4000000000]])
    assert e.value.body["param"] == "input"


def test_openai_embeddings_match_scd_embed(oai):
    """An independent reference: `scd embed` runs the model in its own process, without the server."""
    binary, models, ort = paths()
    env = dict(os.environ, SCD_MODELS_DIR=str(models), SCD_ORT_LIB=str(ort), SCD_EMBEDDING_CACHE="off")
    out = subprocess.run(
        [str(binary), "embed"], input="\n".join(TEXTS), capture_output=True, text=True, env=env, check=True, timeout=300
    )
    reference = [json.loads(line)["embedding"] for line in out.stdout.splitlines()]
    assert len(reference) == len(TEXTS)
    model = oai.models.list().data[0].id
    got = [d.embedding for d in oai.embeddings.create(model=model, input=TEXTS).data]
    for a, b in zip(got, reference):
        assert cosine(a, b) > 0.999
