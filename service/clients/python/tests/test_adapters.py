"""The LangChain compressor and the LlamaIndex postprocessor against a real server."""

from __future__ import annotations

import pytest

from conftest import EVIDENCE, TASK, unavailable


@pytest.fixture
def documents(agent_context):
    return [f for f in agent_context["fields"] if not f["confidential"]]


def test_langchain_compressor(client, documents, o200k):
    try:
        from langchain_core.documents import Document

        from scd_client.langchain import ScdCompressor
    except ImportError as e:
        unavailable(f"langchain-core is not installed ({e}): service/tests/setup.sh")
    docs = [Document(page_content=f["content"], metadata={"source": f["name"], "topic": f["kind"]}) for f in documents]
    compressor = ScdCompressor(client=client, budget=120, tokenizer="o200k")
    out = compressor.compress_documents(docs, TASK)
    assert out
    by_source = {d.metadata["source"]: d for d in docs}
    for d in out:
        src = by_source[d.metadata["scd_source_id"]]
        assert d.metadata["source"] == src.metadata["source"] and d.metadata["topic"] == src.metadata["topic"]
        assert isinstance(d.metadata["scd_score"], float) and d.metadata["scd_chunk_id"]
        assert d.metadata["scd_session_id"]
        assert d.page_content and d.page_content in src.page_content
    sent = sum(len(o200k.encode(d.page_content)) for d in out)
    assert sent < sum(len(o200k.encode(d.page_content)) for d in docs)
    assert sent <= 120
    assert any(e in d.page_content for d in out for e in EVIDENCE)
    assert len({d.metadata["scd_chunk_id"] for d in out}) == len(out)


def test_langchain_compressor_names_documents_without_sources(client):
    try:
        from langchain_core.documents import Document

        from scd_client.langchain import ScdCompressor
    except ImportError as e:
        unavailable(f"langchain-core is not installed ({e}): service/tests/setup.sh")
    docs = [Document(page_content="Charges fail because the pool is exhausted."),
            Document(page_content="The newsletter is sent weekly.")]
    out = ScdCompressor(client=client, rate=1.0).compress_documents(docs, TASK)
    assert out and {d.metadata["scd_source_id"] for d in out} <= {"doc-0", "doc-1"}
    assert ScdCompressor(client=client, budget=10).compress_documents([], TASK) == []


def test_llamaindex_postprocessor(client, documents, o200k):
    try:
        from llama_index.core.schema import NodeRelationship, NodeWithScore, QueryBundle, TextNode

        from scd_client.llamaindex import ScdNodePostprocessor
    except ImportError as e:
        unavailable(f"llama-index-core is not installed ({e}): service/tests/setup.sh")
    nodes = [
        NodeWithScore(node=TextNode(id_=f"node-{f['name']}", text=f["content"], metadata={"field": f["name"]}), score=0.5)
        for f in documents
    ]
    post = ScdNodePostprocessor(client=client, budget=120, tokenizer="o200k")
    out = post.postprocess_nodes(nodes, query_bundle=QueryBundle(TASK))
    assert out and all(isinstance(n, NodeWithScore) for n in out)
    by_id = {n.node.node_id: n.node for n in nodes}
    for n in out:
        src = by_id[n.node.metadata["scd_source_id"]]
        assert n.node.metadata["field"] == src.metadata["field"] and n.node.metadata["scd_chunk_id"]
        assert n.node.text and n.node.text in src.text
        assert isinstance(n.score, float)
        assert n.node.relationships[NodeRelationship.SOURCE].node_id == src.node_id
        # the ids stay out of what the LLM sees
        assert "scd_chunk_id" not in n.node.get_content(metadata_mode="llm")
    sent = sum(len(o200k.encode(n.node.text)) for n in out)
    assert sent < sum(len(o200k.encode(n.node.text)) for n in nodes) and sent <= 120
    assert any(e in n.node.text for n in out for e in EVIDENCE)
    # query_str works too, and no query is an error
    assert post.postprocess_nodes(nodes, query_str=TASK)
    with pytest.raises(ValueError, match="needs the query"):
        post.postprocess_nodes(nodes)
