"""What a vector means: the spec of an embedding model, shared by chunker, embedders and index.

The chunker reads its token budget from here (docs/decisions/chunk-size-follows-embedder.md),
embedders promise vectors of
`dimension`, and every index version's manifest records `model_version` so a reader can refuse
vectors made by another model (docs/decisions/collections-per-tenant-and-version.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingSpec(BaseModel):
    """The contract of one embedding model version."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(
        description="Model name, e.g. 'all-MiniLM-L6-v2' or 'text-embedding-3-small'."
    )
    version: str = Field(
        description="Version of the weights/export/endpoint, e.g. 'onnx-int8-1.0.0'."
    )
    dimension: int = Field(gt=0)
    metric: Literal["cosine"] = "cosine"
    normalization: Literal["l2"] = "l2"
    max_input_tokens: int = Field(gt=0, description="Model input limit, special tokens included.")
    special_tokens: int = Field(
        default=0, ge=0, description="Tokens the model adds to every input ([CLS], [SEP]...)."
    )
    tokenizer: str = Field(
        description=(
            "How to count tokens exactly as the model does: 'tiktoken:<encoding>' or "
            "'hf:<path to tokenizer.json>' or 'hf-package:<package>/<path in package>'."
        )
    )
    query_prefix: str = ""
    document_prefix: str = ""

    @property
    def model_version(self) -> str:
        """The identity stored with every vector and in every manifest: '<name>@<version>'."""
        return f"{self.name}@{self.version}"
