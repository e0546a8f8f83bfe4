"""One process's `VectorStore`, served to other processes of the same machine.

Why: an embedded (qdrant-edge) data dir has one opener, and qdrant-edge holds the GIL while it
searches, so one process caps Retrieve at about one core whatever the machine has
(docs/decisions/retrieve-processes.md). The process that opens the data dir runs a `StoreHost`;
other processes (Retrieve's server processes) use a `HostedStore`, a `VectorStore` that forwards
every call to it. Searches then run in the host while the callers embed, rank and verify in
parallel, each under its own GIL.

Transport: `multiprocessing.connection` over a Unix socket, with its HMAC challenge on a random
key the host hands to the processes it starts (never on a command line or in the environment).
Messages are pickles, so only processes holding the key may connect: a peer that fails the
challenge is dropped before anything of it is unpickled. One connection serves one call at a
time; a `HostedStore` keeps a small pool of them (one per concurrent caller thread), and a
`scroll` holds its own connection until the scan ends or is abandoned.

Errors: a `RagstreamError` raised in the host (StoreError, StoreUnavailableError, ...), or a
ValueError / TypeError for bad arguments, is raised again in the caller, same type and message;
any other exception in the host becomes a StoreError naming it. A host that cannot be reached,
or that goes away mid-call, is a StoreUnavailableError (retry later), like an unreachable
Qdrant server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, cast

from ragcore.errors import RagstreamError, StoreError, StoreUnavailableError
from ragcore.store.base import (
    ChunkRef,
    DenseVector,
    HybridResult,
    Placement,
    PointRecord,
    ScoredHit,
    SparseVector,
    StoredPoint,
    StoreFilter,
    VectorStore,
)

__all__ = [
    "ADVERTISEMENT",
    "HostedStore",
    "StoreHost",
    "advertise",
    "advertised_store",
    "new_host_key",
    "withdraw",
]

log = logging.getLogger(__name__)

#: The `VectorStore` methods a host serves (`close` is the host owner's, never a caller's).
SERVED = frozenset(
    {
        "ensure_collection",
        "drop_collection",
        "collection_exists",
        "upsert",
        "delete_points",
        "delete_by_entity",
        "update_payload",
        "entity_chunks",
        "search_dense",
        "search_sparse",
        "search_hybrid",
        "retrieve",
        "count",
        "optimize",
    }
)
#: Attributes of the hosted store a caller may read (None when the store has none).
ATTRIBUTES = frozenset({"default_placement"})
#: The file in a data dir that names the live host of its store (see `advertise`).
ADVERTISEMENT = "store-host.json"
_SCROLL = "scroll"
_NEXT = "next"
#: Idle connections a `HostedStore` keeps (more callers than this open and close their own).
_POOL = 32
_ACCEPT_POLL_S = 0.2
#: A request on the wire: (method, positional arguments, keyword arguments).
_Request = tuple[str, tuple[Any, ...], dict[str, Any]]
#: Raised again in the caller as they are: ragstream's typed errors, and the programming errors
#: a store raises for bad arguments. Anything else becomes a StoreError naming it.
_AS_IS = (RagstreamError, ValueError, TypeError)


def new_host_key() -> bytes:
    """A fresh random key for one host and the processes it starts."""
    return secrets.token_bytes(32)


class StoreHost:
    """Serves `store` on the Unix socket `address` to peers holding `authkey`.

    `start` binds (the socket file is created with mode 0600) and accepts in a background
    thread; each connection gets a thread of its own. `close` stops accepting, closes every
    connection and removes the socket file; it does not close `store` (its owner does).
    """

    def __init__(self, store: VectorStore, address: Path, *, authkey: bytes) -> None:
        """Serve `store` at `address` (a path for a Unix socket) to holders of `authkey`."""
        if len(authkey) < 16:
            raise StoreError("a store host key must be at least 16 bytes")
        self._store = store
        self.address = Path(address)
        self._authkey = authkey
        self._listener: socket.socket | None = None
        self._peers: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._acceptor: threading.Thread | None = None

    def start(self) -> None:
        """Bind the socket and start accepting peers."""
        if self.address.exists():
            # a stale socket of a host that died; a live host would own the data dir's shards,
            # and this process could not have opened them
            self.address.unlink()
        self.address.parent.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.address))
        finally:
            os.umask(old)
        listener.listen(64)
        # a timeout, so `close` never depends on waking a blocked accept()
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, name="store-host", daemon=True)
        self._acceptor.start()
        log.info("store host serving on %s", self.address)

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closed.is_set():
            try:
                peer, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                log.warning("store host: accept failed", exc_info=True)
                continue
            peer.setblocking(True)
            threading.Thread(
                target=self._serve,
                args=(peer,),
                name="store-host-conn",
                daemon=True,
            ).start()

    def _serve(self, peer: socket.socket) -> None:
        with self._lock:
            self._peers.add(peer)
        conn = Connection(os.dup(peer.fileno()))
        try:
            # what multiprocessing's Listener.accept does, here off the accepting thread
            deliver_challenge(conn, self._authkey)
            answer_challenge(conn, self._authkey)
        except (AuthenticationError, EOFError, OSError) as exc:
            log.warning("store host: a peer was refused: %s", exc)
            self._drop(peer, conn)
            return
        scan: Iterator[StoredPoint] | None = None
        batch = 0
        try:
            while True:
                try:
                    method, args, kwargs = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    if method == _SCROLL:
                        batch = int(kwargs.get("batch", 256))
                        scan = self._store.scroll(*args, **kwargs)
                        method = _NEXT
                    if method == _NEXT:
                        if scan is None:
                            raise StoreError("store host: no scroll in progress")
                        page = list(islice(scan, batch))
                        if len(page) < batch:
                            scan = None
                        reply: tuple[str, Any] = ("ok", page)
                    elif method in SERVED:
                        reply = ("ok", getattr(self._store, method)(*args, **kwargs))
                    elif method in ATTRIBUTES:
                        reply = ("ok", getattr(self._store, method, None))
                    else:
                        raise StoreError(f"store host: {method!r} is not served")
                except _AS_IS as exc:
                    reply = ("error", exc)
                except Exception as exc:  # every failure reaches the caller, typed
                    log.exception("store host: %s failed", method)
                    reply = ("error", StoreError(f"store host: {method}: {exc!r}"))
                try:
                    conn.send(reply)
                except (OSError, ValueError):
                    return
        finally:
            self._drop(peer, conn)

    def _drop(self, peer: socket.socket, conn: Connection) -> None:
        with self._lock:
            self._peers.discard(peer)
        conn.close()
        peer.close()

    def close(self) -> None:
        """Stop accepting, drop every connection and remove the socket file (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._acceptor is not None:
            self._acceptor.join(5)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            # wakes the peer's thread (its recv sees EOF), which then closes it; closing the
            # descriptor under a blocked recv would not
            with contextlib.suppress(OSError):  # the peer hung up already
                peer.shutdown(socket.SHUT_RDWR)
        self.address.unlink(missing_ok=True)


class HostedStore:
    """A `VectorStore` whose every call runs in a `StoreHost` of another process."""

    def __init__(self, address: Path, *, authkey: bytes, timeout_s: float = 30.0) -> None:
        """Talk to the host at `address`; a reply slower than `timeout_s` is an outage."""
        self.address = Path(address)
        self._authkey = authkey
        self._timeout_s = timeout_s
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue(_POOL)
        self._closed = False

    # --- transport --------------------------------------------------------------------------

    def _connect(self) -> Connection:
        if self._closed:
            raise StoreError("the hosted store is closed")
        try:
            return Client(str(self.address), family="AF_UNIX", authkey=self._authkey)
        except AuthenticationError as exc:
            raise StoreError(
                f"store host at {self.address} refused this process's key: {exc}"
            ) from exc
        except (OSError, EOFError) as exc:
            raise StoreUnavailableError(
                f"store host at {self.address} unreachable: {exc}", retry_after=1.0
            ) from exc

    def _exchange(
        self,
        conn: Connection,
        message: _Request,
        *,
        timeout_s: float | None,
    ) -> tuple[str, Any]:
        """Send one request, wait for its reply: ("ok", value) or ("error", exception).
        A transport failure is a StoreUnavailableError, and leaves `conn` out of step."""
        try:
            conn.send(message)
            if timeout_s is not None and not conn.poll(timeout_s):
                raise StoreUnavailableError(
                    f"store host at {self.address}: no reply to {message[0]} in {timeout_s:g} s",
                    retry_after=1.0,
                )
            status, value = conn.recv()
        except (OSError, EOFError) as exc:
            raise StoreUnavailableError(
                f"store host at {self.address} went away during {message[0]}: {exc}",
                retry_after=1.0,
            ) from exc
        return str(status), value

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = self._connect()
        # no reply timeout for optimize: it builds indexes and may run for minutes
        timeout = None if method == "optimize" else self._timeout_s
        try:
            status, value = self._exchange(conn, (method, args, kwargs), timeout_s=timeout)
        except BaseException:
            conn.close()  # a request may be in flight: the connection is out of step
            raise
        self._release(conn)
        if status == "error":
            raise _host_error(method, value)
        return value

    def _release(self, conn: Connection) -> None:
        if self._closed:
            conn.close()
            return
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            conn.close()

    def close(self) -> None:
        """Close the idle connections (the host and its store stay up; idempotent)."""
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    @property
    def default_placement(self) -> Placement | None:
        """The hosted store's placement for a new tenant (a `TieredStore`'s), or None when
        it holds dedicated collections only."""
        value = self._call("default_placement")
        return None if value is None else cast(Placement, value)

    # --- VectorStore ------------------------------------------------------------------------

    def ensure_collection(
        self,
        name: str,
        dimension: int,
        sparse: bool = True,
        *,
        placement: Placement | None = None,
    ) -> None:
        """See `VectorStore.ensure_collection` (runs in the host). Without `placement`, the
        host's store decides (a `TieredStore`'s default for a new collection)."""
        given = {} if placement is None else {"placement": placement}
        self._call("ensure_collection", name, dimension, sparse, **given)

    def drop_collection(self, name: str) -> bool:
        """See `VectorStore.drop_collection` (runs in the host)."""
        return bool(self._call("drop_collection", name))

    def collection_exists(self, name: str) -> bool:
        """See `VectorStore.collection_exists` (runs in the host)."""
        return bool(self._call("collection_exists", name))

    def upsert(self, name: str, points: Sequence[PointRecord], wait: bool = True) -> None:
        """See `VectorStore.upsert` (runs in the host)."""
        self._call("upsert", name, list(points), wait)

    def delete_points(self, name: str, ids: Sequence[str], wait: bool = True) -> None:
        """See `VectorStore.delete_points` (runs in the host)."""
        self._call("delete_points", name, list(ids), wait)

    def delete_by_entity(self, name: str, tenant_id: str, entity_id: str) -> None:
        """See `VectorStore.delete_by_entity` (runs in the host)."""
        self._call("delete_by_entity", name, tenant_id, entity_id)

    def update_payload(
        self,
        name: str,
        ids: Sequence[str],
        values: Mapping[str, Any],
        unset: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        """See `VectorStore.update_payload` (runs in the host)."""
        self._call("update_payload", name, list(ids), dict(values), list(unset), wait)

    def entity_chunks(self, name: str, tenant_id: str, entity_id: str) -> dict[str, ChunkRef]:
        """See `VectorStore.entity_chunks` (runs in the host)."""
        chunks: dict[str, ChunkRef] = self._call("entity_chunks", name, tenant_id, entity_id)
        return chunks

    def search_dense(
        self,
        name: str,
        vector: DenseVector,
        filter: StoreFilter,
        *,
        limit: int,
        with_vectors: bool = False,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """See `VectorStore.search_dense` (runs in the host)."""
        hits: list[ScoredHit] = self._call(
            "search_dense",
            name,
            vector,
            filter,
            limit=limit,
            with_vectors=with_vectors,
            fields=fields,
        )
        return hits

    def search_sparse(
        self,
        name: str,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredHit]:
        """See `VectorStore.search_sparse` (runs in the host)."""
        hits: list[ScoredHit] = self._call(
            "search_sparse", name, sparse, filter, limit=limit, fields=fields
        )
        return hits

    def search_hybrid(
        self,
        name: str,
        dense: DenseVector,
        sparse: SparseVector,
        filter: StoreFilter,
        *,
        limit: int,
        prefetch_limit: int,
        sparse_dense_scores: bool = False,
        fields: Sequence[str] | None = None,
    ) -> HybridResult:
        """See `VectorStore.search_hybrid` (runs in the host)."""
        result: HybridResult = self._call(
            "search_hybrid",
            name,
            dense,
            sparse,
            filter,
            limit=limit,
            prefetch_limit=prefetch_limit,
            sparse_dense_scores=sparse_dense_scores,
            fields=fields,
        )
        return result

    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        tenant_id: str,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
        sparse: bool = True,
    ) -> list[StoredPoint]:
        """See `VectorStore.retrieve` (runs in the host)."""
        points: list[StoredPoint] = self._call(
            "retrieve", name, list(ids), tenant_id, with_vectors, fields=fields, sparse=sparse
        )
        return points

    def count(self, name: str, filter: StoreFilter) -> int:
        """See `VectorStore.count` (runs in the host)."""
        return int(self._call("count", name, filter))

    def scroll(
        self,
        name: str,
        filter: StoreFilter,
        batch: int = 256,
        with_vectors: bool = False,
        *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[StoredPoint]:
        """See `VectorStore.scroll`: pages of `batch` points over a connection of its own,
        closed when the scan ends or is abandoned."""
        if batch <= 0:  # checked here: the host would only see an empty first page
            raise ValueError(f"batch must be > 0, got {batch}")
        conn = self._connect()
        try:
            # `fields` as given: the store checks it (a bare string is refused there)
            options = {"batch": batch, "with_vectors": with_vectors, "fields": fields}
            request: _Request = (_SCROLL, (name, filter), options)
            while True:
                status, value = self._exchange(conn, request, timeout_s=self._timeout_s)
                if status == "error":
                    raise _host_error(_SCROLL, value)
                page: list[StoredPoint] = value
                yield from page
                if len(page) < batch:
                    return
                request = (_NEXT, (), {})
        finally:
            conn.close()

    def optimize(self, name: str) -> bool:
        """See `VectorStore.optimize` (runs in the host, without a reply timeout)."""
        return bool(self._call("optimize", name))


def _host_error(method: str, value: Any) -> Exception:
    """The host's error as it was raised there (`_AS_IS`); anything else as a StoreError."""
    if isinstance(value, _AS_IS):
        return value
    return StoreError(f"store host: {method}: {value!r}")


# --- a data dir's host, for other processes of its owner ------------------------------------


def advertise(data_dir: Path, host: StoreHost, authkey: bytes) -> Path:
    """Name `host` as the live opener of the store in `data_dir`: its socket, its key and this
    process's id, in `<data_dir>/store-host.json` (mode 0600, written atomically). Commands
    run beside a live embedded stack (`ragstream reconcile`, `reindex`, `calibrate`, `index`)
    use the store through it instead of opening the locked shards. The key is no more exposed
    than the data: whoever may read this file may read the store's files as well."""
    path = Path(data_dir) / ADVERTISEMENT
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"address": str(host.address), "key": authkey.hex(), "pid": os.getpid()}
    partial = path.with_name(f".{ADVERTISEMENT}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(doc, out)
    partial.replace(path)
    return path


def withdraw(data_dir: Path) -> None:
    """Remove this process's advertisement of `data_dir` (another process's stays)."""
    path = Path(data_dir) / ADVERTISEMENT
    doc = _read_advertisement(path)
    if doc is not None and doc.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def _read_advertisement(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreError(f"unreadable store host advertisement {path}: {exc}") from exc
    if not isinstance(doc, dict) or not {"address", "key", "pid"} <= doc.keys():
        raise StoreError(f"malformed store host advertisement {path}")
    return doc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive, and its file would not be ours to read
    return True


def advertised_store(data_dir: Path, *, timeout_s: float = 30.0) -> HostedStore | None:
    """The store of `data_dir` through the live process that holds it open, or None when no
    live process advertises it (a stale file of a process that died is ignored). A live host
    that cannot be reached is a StoreUnavailableError: opening the shards would fail on their
    lock anyway."""
    path = Path(data_dir) / ADVERTISEMENT
    doc = _read_advertisement(path)
    if doc is None or not _alive(int(doc["pid"])):
        return None
    store = HostedStore(
        Path(doc["address"]), authkey=bytes.fromhex(doc["key"]), timeout_s=timeout_s
    )
    try:
        store.default_placement  # noqa: B018 - a round trip: reachable, key accepted
    except BaseException:
        store.close()
        raise
    log.info("using the store of %s through its live host (pid %s)", data_dir, doc["pid"])
    return store
