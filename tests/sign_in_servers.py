"""Local stand-ins for the services a sign-in talks to (token endpoints, device flows), each a
real HTTP server on 127.0.0.1 in a thread, answering JSON and recording what it was sent."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class JsonServer:
    """Answers each request with `answer` (a status and a JSON object); `calls` records
    (method, path, lower-cased headers, body bytes) in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str], bytes]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {name.lower(): value for name, value in self.headers.items()}
                server.calls.append((self.command, self.path, headers, body))
                status, answer = server.answer(self.command, self.path, headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def count(self, path: str) -> int:
        return sum(1 for _, called, _, _ in self.calls if called == path)

    @contextmanager
    def running(self) -> Iterator[Any]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
