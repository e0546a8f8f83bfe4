"""The state of a stored calibration against the chunks its version holds now."""

from __future__ import annotations

import json

import pytest

from ragcore.calibration_state import CalibrationState, judge_calibration

pytestmark = pytest.mark.unit


def stored(chunks: int) -> str:
    return json.dumps({"fitted_at": "2026-11-26T08:00:00+00:00", "lexicon": {"n_docs": chunks}})


def test_no_calibration_is_the_prior() -> None:
    state = judge_calibration(None, 40)
    assert (state.state, state.chunks, state.calibrated_chunks, state.change) == (
        "prior",
        40,
        None,
        None,
    )
    assert state.to_dict()["change"] is None


@pytest.mark.parametrize(
    ("then", "now", "expected"),
    [
        (100, 100, "fitted"),
        (100, 120, "fitted"),  # a change of exactly the ratio is not more than it
        (100, 121, "stale"),
        (100, 79, "stale"),  # rows deleted move the corpus as much as rows added
        (100, 80, "fitted"),
        (0, 0, "fitted"),
        (0, 3, "stale"),  # calibrated on an empty version, which has chunks now
    ],
)
def test_a_calibration_is_stale_once_the_chunk_count_moved_more_than_the_ratio(
    then: int, now: int, expected: str
) -> None:
    state = judge_calibration(stored(then), now, stale_ratio=0.2)
    assert state.state == expected
    assert state.calibrated_chunks == then and state.fitted_at == "2026-11-26T08:00:00+00:00"
    if then == 0 and now:
        assert state.to_dict()["change"] is None  # infinite: JSON has no such number


def test_the_ratio_is_a_setting() -> None:
    assert judge_calibration(stored(100), 105, stale_ratio=0.01).state == "stale"
    assert judge_calibration(stored(100), 105, stale_ratio=0.1).state == "fitted"


@pytest.mark.parametrize("text", ["{not json", "{}", '{"lexicon": {}}', '{"lexicon": [1]}'])
def test_a_calibration_that_cannot_be_read_says_so(text: str) -> None:
    state = judge_calibration(text, 10)
    assert state.state == "unreadable"
    assert state.error
    assert state.to_dict()["error"] == state.error


def test_the_json_form_names_everything() -> None:
    assert CalibrationState("stale", 130, 100, "t").to_dict() == {
        "state": "stale",
        "chunks": 130,
        "calibrated_chunks": 100,
        "change": 0.3,
        "fitted_at": "t",
    }
