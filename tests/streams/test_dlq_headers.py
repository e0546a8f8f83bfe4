"""The DLQ headers of a dead letter: where the record came from, why it is there and what it
names; whatever the row held, a header never fails the letter that explains it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import RawRecord
from streams.consumer import DeadLetter, dlq_headers

pytestmark = pytest.mark.unit

RECORD = RawRecord("sor.public.entities", 2, 41, b"k", b"v", (("orig", b"1"),), 1_700_000_000_000)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(), st.text(), st.text())
def test_any_text_a_row_held_makes_valid_headers(
    message: str, column: str, entity: str, tenant: str
) -> None:
    # `st.text()` draws lone surrogates too: what a JSON `\ud800` escape in a row decodes to
    letter = DeadLetter(RECORD, "MAPPING_ERROR", message, "plan", "t", column, entity, tenant)
    headers = dict(dlq_headers(letter, truncated=False))
    for name in ("message", "column", "entity", "tenant"):
        value = headers[f"ragstream.error.{name}"]
        assert isinstance(value, bytes)
        value.decode("utf-8")  # valid UTF-8 always
    assert headers["ragstream.source.offset"] == b"41"
    assert headers["orig"] == b"1"  # the record's own headers are kept


def test_a_url_with_credentials_in_a_message_is_redacted_in_its_header() -> None:
    message = "GET https://bob:s3cret@files.example/a.pdf?X-Amz-Signature=abc failed"
    letter = DeadLetter(RECORD, "DOCUMENT_UNAVAILABLE", message, "apply", "documents")
    header = dict(dlq_headers(letter, truncated=False))["ragstream.error.message"]
    assert isinstance(header, bytes)
    assert b"s3cret" not in header and b"abc" not in header
    assert b"files.example/a.pdf" in header
