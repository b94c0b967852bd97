"""SCD as a LangChain document compressor (the ``langchain`` extra: langchain-core).

:class:`ScdCompressor` sends the retrieved documents as one context (a field
per document) with the query as the task, and returns the chunks SCD selects
within the budget, one ``Document`` each, in reading order::

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from scd_client import Client
    from scd_client.langchain import ScdCompressor

    compressor = ScdCompressor(client=Client("http://127.0.0.1:9090"), budget=1000)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)

Each returned document keeps its source document's metadata and adds
``scd_score``, ``scd_chunk_id``, ``scd_source_id`` (the field name: the
source's ``metadata["source"]``, else its ``metadata["id"]`` or ``id``, when
unique across the documents, else ``doc-{i}``) and ``scd_session_id``. A
document's ``metadata["scd_kind"]`` sets its field's kind (else the
extension of its ``source``), and ``metadata["scd_confidential"]`` keeps it
out of what the server sends back.
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.documents.compressor import BaseDocumentCompressor
from pydantic import ConfigDict, Field, model_validator

from ._adapt import field_kind, unique_names
from ._client import Client

__all__ = ["ScdCompressor"]


class ScdCompressor(BaseDocumentCompressor):
    """Documents in, the chunks SCD selects for the query out (within ``budget`` or ``rate``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client
    """The SCD server to call."""
    budget: int | None = None
    """Tokens of ``tokenizer`` the selection may take (or give ``rate``)."""
    rate: float | None = None
    """The share of the documents' tokens to keep, in (0, 1] (or give ``budget``)."""
    tokenizer: str | None = "o200k"
    """The receiving model's tokenizer the budget counts in (``o200k``, ``cl100k``, ``e5``)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Further ``/v1/compress`` options (``threshold``, ``min_relative_score``, …)."""

    @model_validator(mode="after")
    def _one_budget(self) -> "ScdCompressor":
        if (self.budget is None) == (self.rate is None):
            raise ValueError("budget and rate: give exactly one")
        return self

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """The chunks of ``documents`` SCD selects for ``query``, one ``Document`` each."""
        docs = list(documents)
        if not docs:
            return []
        names = unique_names(
            [
                [d.metadata.get("source") for d in docs],
                [d.metadata.get("id") for d in docs],
                [d.id for d in docs],
            ]
        )
        fields = [
            {
                "name": name,
                "kind": field_kind(d.metadata, "source"),
                "content": d.page_content,
                "confidential": bool(d.metadata.get("scd_confidential", False)),
            }
            for name, d in zip(names, docs)
        ]
        r = self.client.compress(
            query, fields, budget=self.budget, rate=self.rate, tokenizer=self.tokenizer, **self.options
        )
        source = dict(zip(names, docs))
        out = []
        for c in r.chunks:
            doc = source.get(c.field)
            if doc is None or c.text is None:
                continue
            metadata = dict(doc.metadata)
            metadata.update(
                scd_score=c.score, scd_chunk_id=c.id, scd_source_id=c.field, scd_session_id=r.session_id
            )
            out.append(Document(page_content=c.text, metadata=metadata))
        return out
