"""`ragstream index`, `reconcile`, `calibrate` and `reindex` while `ragstream dev` runs: they use
the store through the stack's store host instead of refusing on the locked shards, and the
live stack serves what they change."""

from __future__ import annotations

import json

import pytest

from ragcore.store.host import ADVERTISEMENT
from tests.ragdev.test_dev_stack import entity_ids
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
