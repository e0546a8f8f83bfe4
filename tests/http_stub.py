"""A loopback HTTP server answering JSON POSTs with a test's handler (the stand-in for
OpenAI-compatible embedding and rerank endpoints; no such service runs on these machines)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
