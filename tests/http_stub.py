"""A loopback HTTP server answering JSON POSTs with a test's handler (the stand-in for
OpenAI-compatible embedding and rerank endpoints; no such service runs on these machines)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, TypeVar

#: (status, raw response body, extra headers)
Response = tuple[int, bytes, dict[str, str]]
#: (path, lower-cased headers, JSON body) -> the response
Answer = Callable[[str, dict[str, str], Any], Response]


def _handler(answer: Answer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean; the stubs record the requests themselves

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, payload, extra = answer(self.path, headers, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            # A client that timed out has gone away: that is the scenario, not a stub failure.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(payload)

    return Handler


@contextlib.contextmanager
def serve_json(answer: Answer) -> Iterator[str]:
    """Serve `answer` on a loopback port; yields `http://127.0.0.1:<port>`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _Closable(Protocol):
    def close(self) -> None: ...


R = TypeVar("R")
C = TypeVar("C", bound=_Closable)


@dataclass
class ScriptedStub(Generic[R, C]):
    """A stub endpoint's state: the scripted replies (then `default()` ones), the requests it
    received as (path, lower-cased headers, JSON body), and the clients a test made (closed
    when the stub stops)."""

    default: Callable[[], R]
    url: str = ""
    script: list[R] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    clients: list[C] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, path: str, headers: dict[str, str], body: Any) -> R:
        """Record the request; the next scripted reply, or the default one."""
        with self.lock:
            self.requests.append((path, headers, body))
            return self.script.pop(0) if self.script else self.default()

    @contextlib.contextmanager
    def serving(self, answer: Answer, suffix: str = "") -> Iterator[ScriptedStub[R, C]]:
        """Serve `answer` on loopback with `url` = the server's address + `suffix`."""
        with serve_json(answer) as base:
            self.url = base + suffix
            try:
                yield self
            finally:
                for client in self.clients:
                    client.close()


@dataclass
class Sleeps:
    """Stands in for `time.sleep` in a client under test: records the backoff delays."""

    delays: list[float] = field(default_factory=list)

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
