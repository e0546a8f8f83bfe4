"""`ragstream bench embedder --batch-sizes`: its change-stream texts and its argument checks."""

from __future__ import annotations

import pytest

from ragdev.bench.embedder import cut, main

pytestmark = pytest.mark.unit


def test_cut_keeps_a_random_leading_part_of_each_text_deterministically() -> None:
    texts = [" ".join(f"w{i}" for i in range(n)) for n in (1, 5, 40, 200)] * 5
    once, again = cut(texts, seed=3), cut(texts, seed=3)
    assert once == again
    assert cut(texts, seed=4) != once
    for text, part in zip(texts, once, strict=True):
        words, kept = text.split(), part.split()
        assert 1 <= len(kept) <= len(words)
        assert kept == words[: len(kept)]
    # mixed lengths: the long texts are not all kept whole
    assert len({len(p.split()) for p in once[3::4]}) > 1


@pytest.mark.parametrize("sizes", ["0,4", "x", ","])
def test_bad_batch_sizes_are_refused(sizes: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--batch-sizes", sizes])
    assert exc.value.code == 2


@pytest.mark.parametrize("executions", ["float,fused", "", "int4"])
def test_unknown_executions_are_refused(executions: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--executions", executions])
    assert exc.value.code == 2
