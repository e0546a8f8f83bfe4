"""`ragstream bench embedder --batch-sizes`: its change-stream texts and its argument checks;
the executions the benches name (`execution_config`), and `bench cdc`'s choice of one."""

from __future__ import annotations

import pytest

from ragdev.bench import cdc
from ragdev.bench.embedder import cut, execution_config, main

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


def test_each_execution_names_its_settings_and_the_rest_are_the_defaults() -> None:
    fused, unfused, int8 = (execution_config(e) for e in ("float", "float-unfused", "int8"))
    assert (fused.execution, fused.fused_attention) == ("float", True)
    assert (unfused.execution, unfused.fused_attention) == ("float", False)
    assert int8.execution == "int8"
    assert fused.model_dump() == type(fused)().model_dump()  # the default embedder


@pytest.mark.parametrize("execution", ["fused", "int4"])
def test_bench_cdc_refuses_an_unknown_execution(execution: str) -> None:
    with pytest.raises(SystemExit) as exc:
        cdc.main(["--embedder-execution", execution])
    assert exc.value.code == 2
