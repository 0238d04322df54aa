"""A vLLM or SGLang server as the remote client sees it, on 127.0.0.1: the responses in fixtures/remote/
served by a real HTTP server, which records every request so tests can check what the client sent.
vLLM's /metrics counters move on by one answer's worth after each streamed answer, as on a real server."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "remote"
ROUTES = {
    "vllm": {"/v1/models": "vllm_models.json", "/v1/chat/completions": "vllm_chat_stream.txt",
             "/v1/completions": "vllm_chat_stream.txt"},
    "sglang": {"/v1/models": "sglang_models.json", "/v1/chat/completions": "sglang_chat_stream.txt",
               "/generate": "sglang_generate_stream.txt"},
}


class FakeServer:
    def __init__(self, kind: str, api_key: str = "", spec_metrics: bool = True):
        self.kind, self.api_key = kind, api_key
        self.requests: list[dict] = []
        self.metrics = ["vllm_metrics_before.txt", "vllm_metrics_after.txt"] if spec_metrics else \
            ["vllm_metrics_plain.txt"] * 2
        self.answers = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.answer(self, None)

            def do_POST(self):
                fake.answer(self, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, h: BaseHTTPRequestHandler, body: dict | None) -> None:
        self.requests.append({"method": h.command, "path": h.path, "body": body,
                              "authorization": h.headers.get("Authorization")})
        if self.api_key and h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.send(h, 401, "application/json", json.dumps(
                {"error": {"message": "Invalid API key.", "type": "invalid_request_error", "code": 401}}))
        if h.path == "/metrics" and self.kind == "vllm":
            return self.send(h, 200, "text/plain", (FIXTURES / self.metrics[min(self.answers, 1)]).read_text())
        name = ROUTES[self.kind].get(h.path)
        if name is None:
            return self.send(h, 404, "application/json", json.dumps({"detail": "Not Found"}))
        if name.endswith(".txt"):
            self.answers += 1
        self.send(h, 200, "text/event-stream" if name.endswith(".txt") else "application/json",
                  (FIXTURES / name).read_text())

    @staticmethod
    def send(h: BaseHTTPRequestHandler, status: int, kind: str, text: str) -> None:
        data = text.encode()
        h.send_response(status)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def posts(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
