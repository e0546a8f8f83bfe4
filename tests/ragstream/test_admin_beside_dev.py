"""`ragstream index`, `reconcile`, `calibrate` and `reindex` while `ragstream dev` runs: they use
the store through the stack's store host instead of refusing on the locked shards, and the
live stack serves what they change."""

from __future__ import annotations

import json

import pytest

from ragcore.store.host import ADVERTISEMENT
from tests.ragdev.test_dev_stack import entity_ids, wait_for
from tests.ragstream.conftest import RunningDev, dev_env_mode

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_stack_advertises_its_store_host_privately(running_dev: RunningDev) -> None:
    data = running_dev.dev.data_dir
    assert dev_env_mode(data / "store" / ADVERTISEMENT) == 0o600
    assert dev_env_mode(data / "dev.env") == 0o600
    assert "set -a; . " in running_dev.dev.output()  # the banner says how


def test_index_and_reconcile_run_beside_the_live_stack(running_dev: RunningDev) -> None:
    listed = running_dev.run("index", "list", "--tenant", "acme")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["active"] == 1 and doc["versions"][0]["points"] > 0
    assert "through its live host" in listed.stderr

    placements = running_dev.run("index", "placement")
    assert placements.returncode == 0, placements.stderr
    assert {t["tenant"] for t in json.loads(placements.stdout)["tenants"]} == {"acme", "globex"}

    reconciled = running_dev.run("reconcile", "--tenant", "acme")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    report = json.loads(reconciled.stdout)
    assert report["drift"] == 0 and report["sor_entities"] > 0, report
    # the dev stack calibrated every tenant at start, on the chunks it holds now
    assert report["calibration"]["state"] == "fitted", report["calibration"]
    assert report["calibration"]["chunks"] == report["points_scanned"]


def test_calibrate_and_reindex_beside_the_live_stack_which_then_serves_the_new_version(
    running_dev: RunningDev,
) -> None:
    calibrated = running_dev.run("calibrate", "--tenant", "acme", "--queries", "20")
    assert calibrated.returncode == 0, calibrated.stderr
    assert json.loads(calibrated.stdout)["index"] == "rag__acme__v1"

    question = "how often should the seal of the GX-300 be checked?"
    before = running_dev.dev.query("globex", question)
    assert before["index_version"] == 1
    reindexed = running_dev.run(
        "reindex", "--tenant", "globex", "--grace-s", "0", "--settle-s", "1"
    )
    assert reindexed.returncode == 0, reindexed.stdout + reindexed.stderr
    assert json.loads(reindexed.stdout)["outcome"] == "switched"
    after = running_dev.dev.query("globex", question)  # the live stack reads the switch
    assert (after["index_name"], after["index_version"]) == ("rag__globex__v2", 2)
    assert after["status"] == before["status"]
    assert entity_ids(after) == entity_ids(before)  # same content, same model: same answer


def test_calibrate_stale_refits_only_the_tenants_whose_index_moved_since(
    running_dev: RunningDev,
) -> None:
    """Listed first (`--dry-run`), then refitted: only acme, after a row was added to it."""

    def due(*args: str) -> dict[str, dict[str, object]]:
        listed = running_dev.run("calibrate", *args, "--dry-run")
        assert listed.returncode == 0, listed.stderr
        doc = json.loads(listed.stdout)
        assert doc["calibrated"] == 0 and doc["dry_run"] is True
        return {t["tenant"]: t["before"] for t in doc["tenants"]}

    everyone = due("--all")
    assert set(everyone) == {"acme", "globex"}
    assert {t["state"] for t in everyone.values()} == {"fitted"}
    assert due("--stale", "--stale-ratio", "0.01") == {}

    running_dev.dev.cli(
        "sor", "put", "--tenant", "acme", "--id", "calibration-canary",
        "--text", "The canary of the calibration test sings in the server room at dawn.",
    )  # fmt: skip
    canary = "entities:calibration-canary"
    question = "where does the canary sing?"
    wait_for(lambda: canary in entity_ids(running_dev.dev.query("acme", question)))
    stale = due("--stale", "--stale-ratio", "0.01")
    assert set(stale) == {"acme"}, stale
    assert stale["acme"]["state"] == "stale"
    assert stale["acme"]["chunks"] == int(str(everyone["acme"]["chunks"])) + 1

    refit = running_dev.run("calibrate", "--stale", "--stale-ratio", "0.01", "--queries", "20")
    assert refit.returncode == 0, refit.stderr
    doc = json.loads(refit.stdout)
    assert [(t["tenant"], t["calibrated"]) for t in doc["tenants"]] == [("acme", True)]
    assert doc["failed"] == 0
    assert due("--stale", "--stale-ratio", "0.01") == {}


def test_a_row_that_once_killed_the_worker_is_a_dead_letter_and_the_stack_goes_on(
    running_dev: RunningDev,
) -> None:
    """Issue 41's first report, as a new user met it: `sor put` of metadata nested 3,000 deep
    raised RecursionError in the planner and ended ingest for every tenant, while health said
    SERVING. Now it is a MAPPING_ERROR letter naming its table, column and entity, and a later
    change of another tenant is searchable. (Last in the file: it adds rows to acme.)"""
    deep = "[" * 3000 + "]" * 3000
    running_dev.dev.cli(
        "sor", "put", "--tenant", "acme", "--id", "deep-metadata", "--text", "hi",
        "--set", f'metadata={{"a": {deep}}}',
    )  # fmt: skip
    running_dev.dev.cli(
        "sor", "put", "--tenant", "globex", "--id", "after-deep-metadata",
        "--text", "The lighthouse keeper logs the fog horn test every Tuesday at noon.",
    )  # fmt: skip
    question = "when does the lighthouse keeper test the fog horn?"
    wait_for(
        lambda: (
            "entities:after-deep-metadata" in entity_ids(running_dev.dev.query("globex", question))
        ),
        timeout=60,
    )
    listed = running_dev.run("dlq", "list", "--idle-s", "2")
    assert listed.returncode == 0, listed.stderr
    letters = [
        doc["headers"]
        for doc in json.loads(listed.stdout)
        if doc["headers"].get("ragstream.error.entity") == "entities:deep-metadata"
    ]
    assert len(letters) == 1, listed.stdout[-2000:]
    assert letters[0]["ragstream.error.code"] == "MAPPING_ERROR"
    assert letters[0]["ragstream.error.table"] == "entities"
    assert letters[0]["ragstream.error.column"] == "metadata"
    assert letters[0]["ragstream.error.tenant"] == "acme"
    assert running_dev.dev.proc.poll() is None  # the stack runs on
