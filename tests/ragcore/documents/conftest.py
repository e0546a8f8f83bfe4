"""One extraction child for a test module (starting one imports the parsers: ~1 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragcore.documents import Extractor


@pytest.fixture(scope="module")
def extractor() -> Iterator[Extractor]:
    extractor = Extractor()
    yield extractor
    extractor.close()
