"""SCD as a LlamaIndex node postprocessor (the ``llamaindex`` extra: llama-index-core).

:class:`ScdNodePostprocessor` sends the retrieved nodes as one context (a
field per node, named by its ``node_id``) with the query as the task, and
returns the chunks SCD selects within the budget, in reading order::

    from scd_client import Client
    from scd_client.llamaindex import ScdNodePostprocessor

    post = ScdNodePostprocessor(client=Client("http://127.0.0.1:9090"), budget=1000)
    engine = index.as_query_engine(node_postprocessors=[post])

Each returned ``NodeWithScore`` holds a ``TextNode`` with the chunk's text,
its source node's metadata plus ``scd_chunk_id``, ``scd_source_id`` (the
source's ``node_id``) and ``scd_session_id`` (kept out of what the LLM and
the embedder see), a SOURCE relationship to the source node, and the
chunk's score. A node's ``metadata["scd_kind"]`` sets its field's kind (else
the extension of its ``file_path`` or ``file_name``), and
``metadata["scd_confidential"]`` keeps it out of what the server sends back.

Nothing here downloads anything: this path of llama-index-core uses neither
its tokenizer nor NLTK data.
"""

from __future__ import annotations

from typing import Any, List, Optional

from llama_index.core.bridge.pydantic import Field, model_validator
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeRelationship, NodeWithScore, QueryBundle, TextNode

from ._adapt import field_kind, unique_names
from ._client import Client

__all__ = ["ScdNodePostprocessor"]

_ADDED = ["scd_chunk_id", "scd_source_id", "scd_session_id"]


class ScdNodePostprocessor(BaseNodePostprocessor):
    """Nodes in, the chunks SCD selects for the query out (within ``budget`` or ``rate``)."""

    client: Client = Field(exclude=True, description="The SCD server to call.")
    budget: Optional[int] = Field(default=None, description="Tokens of `tokenizer` the selection may take.")
    rate: Optional[float] = Field(default=None, description="The share of the nodes' tokens to keep, in (0, 1].")
    tokenizer: Optional[str] = Field(default="o200k", description="The tokenizer the budget counts in.")
    options: dict[str, Any] = Field(default_factory=dict, description="Further /v1/compress options.")

    @model_validator(mode="after")
    def _one_budget(self) -> "ScdNodePostprocessor":
        if (self.budget is None) == (self.rate is None):
            raise ValueError("budget and rate: give exactly one")
        return self

    @classmethod
    def class_name(cls) -> str:
        return "ScdNodePostprocessor"

    def _postprocess_nodes(
        self,
        nodes: List[NodeWithScore],
        query_bundle: Optional[QueryBundle] = None,
    ) -> List[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("ScdNodePostprocessor: needs the query (query_bundle or query_str)")
        nodes = list(nodes)
        if not nodes:
            return []
        names = unique_names([[n.node.node_id for n in nodes]])
        contents = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        fields = [
            {
                "name": name,
                "kind": field_kind(n.node.metadata, "file_path", "file_name"),
                "content": content,
                "confidential": bool(n.node.metadata.get("scd_confidential", False)),
            }
            for name, n, content in zip(names, nodes, contents)
        ]
        r = self.client.compress(
            query_bundle.query_str,
            fields,
            budget=self.budget,
            rate=self.rate,
            tokenizer=self.tokenizer,
            **self.options,
        )
        source = {name: n.node for name, n in zip(names, nodes)}
        out: List[NodeWithScore] = []
        for c in r.chunks:
            if c.field not in source or c.text is None:
                continue
            node = source[c.field]
            metadata = dict(node.metadata)
            metadata.update(scd_chunk_id=c.id, scd_source_id=c.field, scd_session_id=r.session_id)
            chunk = TextNode(
                text=c.text,
                metadata=metadata,
                excluded_embed_metadata_keys=list(node.excluded_embed_metadata_keys) + _ADDED,
                excluded_llm_metadata_keys=list(node.excluded_llm_metadata_keys) + _ADDED,
                relationships={NodeRelationship.SOURCE: node.as_related_node_info()},
            )
            out.append(NodeWithScore(node=chunk, score=c.score))
        return out
