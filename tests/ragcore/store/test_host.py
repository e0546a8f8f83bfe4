"""`HostedStore` over a `StoreHost`: the whole `VectorStore` contract through the socket, on
both placements, and the transport's failure modes (typed errors, refused peers, outages).

The host runs in a thread of the test process here (real Unix socket, real key challenge,
real pickles); `tests/retrieval_api/test_processes.py` runs it across processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from ragcore.errors import StoreError, StoreUnavailableError
from ragcore.store.edge import EdgeStore
from ragcore.store.host import (
    ADVERTISEMENT,
    HostedStore,
    StoreHost,
    advertise,
    advertised_store,
    new_host_key,
    withdraw,
)
from ragcore.store.tiered import FilePlacementCatalog, TieredStore
from tests.ragcore.store.contract import (
    COLLECTION,
    DIM,
    DOCS,
    SCHEMA,
    StoreFactory,
    VectorStoreContract,
    acme,
    record,
)

pytestmark = pytest.mark.integration


class _Hosted(HostedStore):
    """A client that also owns its host and the hosted store (closed with it)."""

    def __init__(self, store: TieredStore, address: Path) -> None:
        key = new_host_key()
        self.host = StoreHost(store, address, authkey=key)
        self.host.start()
        self.owned = store
        # the contract's tenant-isolation check patches the engine adapter: the host's, here
        self.engine = store.engine
        super().__init__(address, authkey=key, timeout_s=10.0)

    def close(self) -> None:
        super().close()
        self.host.close()
        self.owned.close()


def _tiered(data: Path, placement: str) -> TieredStore:
    return TieredStore(
        EdgeStore(data, schema=SCHEMA),
        FilePlacementCatalog(data),
        default_placement="shared" if placement == "shared" else "dedicated",
    )


class TestHostedDedicated(VectorStoreContract):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: _Hosted(_tiered(tmp_path / "data", "dedicated"), tmp_path / "s.sock")


class TestHostedShared(VectorStoreContract):
    one_tenant_per_collection = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda: _Hosted(_tiered(tmp_path / "data", "shared"), tmp_path / "s.sock")


@pytest.fixture
def hosted(tmp_path: Path) -> Iterator[_Hosted]:
    store = _Hosted(_tiered(tmp_path / "data", "dedicated"), tmp_path / "s.sock")
    yield store
    store.close()


def test_a_host_error_arrives_typed_and_the_connection_stays_usable(hosted: _Hosted) -> None:
    with pytest.raises(StoreError, match="not_there") as caught:
        hosted.upsert("not_there", [record(DOCS[0])])
    assert type(caught.value) is StoreError
    hosted.ensure_collection(COLLECTION, DIM)
    hosted.upsert(COLLECTION, [record(d) for d in DOCS if d.tenant == "acme"])
    assert hosted.count(COLLECTION, acme()) == 6


def test_a_scroll_abandoned_midway_does_not_disturb_other_calls(hosted: _Hosted) -> None:
    hosted.ensure_collection(COLLECTION, DIM)
    hosted.upsert(COLLECTION, [record(d) for d in DOCS])
    scan = hosted.scroll(COLLECTION, acme(), batch=2)
    first = next(scan)
    assert hosted.count(COLLECTION, acme()) == 6  # while the scan holds its own connection
    rest = list(scan)
    assert len(rest) == 5 and first.point_id not in {p.point_id for p in rest}
    again = hosted.scroll(COLLECTION, acme(), batch=2)
    assert isinstance(again, Generator)
    next(again)
    again.close()  # abandoned: its connection closes, the host drops the scan
    assert len(list(hosted.scroll(COLLECTION, acme(), batch=4))) == 6


def test_concurrent_callers_each_get_their_own_answers(hosted: _Hosted) -> None:
    hosted.ensure_collection(COLLECTION, DIM)
    hosted.upsert(COLLECTION, [record(d) for d in DOCS])
    expected = {d.chunk_id: d for d in DOCS if d.tenant == "acme"}
    errors: list[BaseException] = []

    def work(doc_id: str) -> None:
        try:
            for _ in range(30):
                [point] = hosted.retrieve(COLLECTION, [expected[doc_id].point_id], "acme")
                assert point.point_id == expected[doc_id].point_id
        except (AssertionError, StoreError, ValueError) as exc:  # asserted empty below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_peer_without_the_key_is_refused(hosted: _Hosted) -> None:
    stranger = HostedStore(hosted.address, authkey=new_host_key(), timeout_s=2.0)
    with pytest.raises(StoreError, match="refused this process's key"):
        stranger.collection_exists(COLLECTION)
    assert not hosted.collection_exists(COLLECTION)  # the host still serves its own peers


def test_a_raw_peer_sending_garbage_is_dropped_before_anything_is_unpickled(
    hosted: _Hosted,
) -> None:
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(hosted.address))
        raw.settimeout(5)
        raw.recv(1024)  # the host's challenge
        raw.sendall(b"\x00\x00\x00\x05hello")
        reply = raw.recv(1024)
        assert reply == b"" or reply.endswith(b"#FAILURE#")
    assert not hosted.collection_exists(COLLECTION)


def test_the_socket_is_private_to_its_user(hosted: _Hosted) -> None:
    assert hosted.address.stat().st_mode & 0o777 == 0o600


def test_a_host_gone_is_an_outage_not_a_crash(tmp_path: Path) -> None:
    store = _tiered(tmp_path / "data", "dedicated")
    key = new_host_key()
    host = StoreHost(store, tmp_path / "s.sock", authkey=key)
    host.start()
    client = HostedStore(tmp_path / "s.sock", authkey=key, timeout_s=2.0)
    try:
        client.ensure_collection(COLLECTION, DIM)
        host.close()
        with pytest.raises(StoreUnavailableError, match=r"s\.sock"):
            client.count(COLLECTION, acme())
        with pytest.raises(StoreUnavailableError, match="unreachable"):
            client.count(COLLECTION, acme())
        # a new host on the same data dir and socket: the client carries on
        host = StoreHost(store, tmp_path / "s.sock", authkey=key)
        host.start()
        assert client.count(COLLECTION, acme()) == 0
    finally:
        client.close()
        host.close()
        store.close()


def test_an_advertised_live_host_serves_its_data_dir_to_other_openers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = _tiered(data, "shared")
    key = new_host_key()
    host = StoreHost(store, tmp_path / "h.sock", authkey=key)
    host.start()
    try:
        assert advertised_store(data) is None  # nothing advertised yet
        path = advertise(data, host, key)
        assert path == data / ADVERTISEMENT and path.stat().st_mode & 0o777 == 0o600
        client = advertised_store(data)
        assert client is not None
        try:
            assert client.default_placement == "shared"
            client.ensure_collection("rag__acme__v1", 4)
            assert store.collection_exists("rag__acme__v1")  # it went to the host's store
        finally:
            client.close()
        withdraw(data)
        assert not path.exists()
    finally:
        host.close()
        store.close()


def test_a_stale_or_foreign_advertisement_is_handled(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    doc = {"address": str(tmp_path / "gone.sock"), "key": "00" * 32, "pid": dead.pid}
    (data / ADVERTISEMENT).write_text(json.dumps(doc))
    assert advertised_store(data) is None  # its process died: open the store directly
    withdraw(data)  # not this process's advertisement: kept
    assert (data / ADVERTISEMENT).exists()
    # a live process whose socket is gone: an outage, not a silent second opener
    (data / ADVERTISEMENT).write_text(json.dumps({**doc, "pid": os.getpid()}))
    with pytest.raises(StoreUnavailableError):
        advertised_store(data)
    (data / ADVERTISEMENT).write_text("{not json")
    with pytest.raises(StoreError, match="unreadable"):
        advertised_store(data)
