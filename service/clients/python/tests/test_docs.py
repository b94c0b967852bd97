"""docs/rest.md's LangChain 1.x example, run as written against a real `scd serve`.

The block is read from the document (the one after its marker comment), so
the document cannot drift from what works. There is no network here:
tiktoken reads cl100k_base from the copy llama-index-core ships, which
holds the very file tiktoken would download (tiktoken checks its SHA-256).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import EVIDENCE, ROOT, SECRET, need, unavailable

DOC = ROOT / "docs" / "rest.md"
MARKER = "<!-- service/clients/python/tests/test_docs.py runs the next block against a real `scd serve` -->"


def example() -> str:
    """The python block right after the marker in docs/rest.md."""
    text = DOC.read_text()
    assert text.count(MARKER) == 1, f"{DOC}: the marker must appear once"
    after = text.split(MARKER, 1)[1].lstrip("\n")
    assert after.startswith("```python\n"), f"{DOC}: no python block after the marker"
    return after[len("```python\n"):].split("\n```", 1)[0] + "\n"


def tiktoken_cache() -> Path:
    """The folder holding cl100k_base.tiktoken (llama-index-core's copy), checked."""
    llama = need("llama_index.core")
    tiktoken = need("tiktoken")
    cache = Path(llama.__file__).parent / "_static" / "tiktoken_cache"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        tiktoken.get_encoding("cl100k_base")
    except Exception as e:  # a download attempt fails: no network here
        unavailable(f"cl100k_base is not in {cache}: {e}")
    return cache


def test_the_langchain_example_in_rest_md_runs_as_written(server):
    for module in ("langchain_classic.retrievers", "langchain_openai", "langchain_core.vectorstores"):
        need(module)
    env = dict(os.environ, SCD_URL=server.url, TIKTOKEN_CACHE_DIR=str(tiktoken_cache()))
    # no key or proxy of the caller's may send it elsewhere
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2"):
        env.pop(var, None)
    r = subprocess.run(
        [sys.executable, "-c", example()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"the example failed:\n{r.stdout}\n{r.stderr}\n--- server ---\n{server.stderr_tail()}"
    out = r.stdout
    # chunks of the documents, each tagged with its source, the evidence among them
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert lines, out
    with open(ROOT / "fixtures" / "agent_context.json") as f:
        names = {x["name"] for x in json.load(f)["fields"] if not x["confidential"]}
    assert {line[1:].split("]", 1)[0] for line in lines} <= names, out
    assert any(e in out for e in EVIDENCE), out
    assert SECRET not in out


def test_openai_embeddings_defaults_send_cl100k_token_ids(server):
    """What the example relies on: OpenAIEmbeddings as it comes sends token ids, not text, and gets E5 vectors."""
    httpx = need("httpx")
    lc = need("langchain_openai")
    tiktoken = need("tiktoken")
    tiktoken_cache()
    sent = []

    def record(request):
        sent.append(json.loads(request.content))

    client = httpx.Client(event_hooks={"request": [record]})
    emb = lc.OpenAIEmbeddings(model="e5-small", base_url=f"{server.url}/v1", api_key="unused", http_client=client)
    texts = ["connection pool exhausted", "The newsletter is sent weekly."]
    vectors = emb.embed_documents(texts)
    assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
    bodies = [b for b in sent if "input" in b]
    assert bodies, sent
    cl100k = tiktoken.get_encoding("cl100k_base")
    assert bodies[0]["input"] == [cl100k.encode_ordinary(t) for t in texts], bodies[0]
    # the same vectors as the texts themselves (the server decodes the ids)
    plain = lc.OpenAIEmbeddings(
        model="e5-small", base_url=f"{server.url}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    for a, b in zip(vectors, plain.embed_documents(texts)):
        assert sum(x * y for x, y in zip(a, b)) > 0.999
