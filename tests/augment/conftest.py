"""A scripted OpenAI-compatible chat server (http.server in a thread) and small datasets for the augment tests.

The server answers POST /v1/chat/completions with the real response shape and GET /v1/models.
It solves "What is A + B?" problems; words in the problem script faults:
SLOW (sleeps past the client timeout), FLAKY (HTTP 500 on the first try of each prompt),
GARBAGE (text without the asked-for format), WRONG (a wrong boxed answer), BADJSON (a 200
whose body is not JSON, every time).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

MODEL_NAME = "test-teacher"


class ChatServer:
    """State shared with the handler: what was asked, how often, and the current fault script."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.hits: Counter[str] = Counter()
        self.slow = True  # SLOW problems time out while this is on
        self.lock = threading.Lock()
        self.url = ""
        self.model = MODEL_NAME

    def reply(self, body: dict) -> tuple[int, str]:
        """(status, response body) for one chat request."""
        content = body["messages"][-1]["content"]
        text = content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")
        problem = text.split("Problem:\n", 1)[1].strip()
        kind = "paraphrase" if "Rewrite the problem" in text else "solve"
        with self.lock:
            self.requests.append(body)
            self.hits[f"{kind}:{problem}"] += 1
            first = self.hits[f"{kind}:{problem}"] == 1
        if "SLOW" in problem and self.slow:
            time.sleep(0.6)
        if "FLAKY" in problem and first:
            return 500, json.dumps({"error": {"message": "temporarily overloaded"}})
        if "BADJSON" in problem:
            return 200, "<html>proxy error</html>"
        if "GARBAGE" in problem:
            return 200, completion("Sure! Here is something unrelated.")
        return 200, completion(paraphrase(problem) if kind == "paraphrase" else solve(problem))


def completion(text: str) -> str:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL_NAME,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })


def _numbers(problem: str) -> tuple[int, int]:
    a, b = map(int, re.search(r"(\d+) \+ (\d+)", problem).groups())
    return a, b


def paraphrase(problem: str) -> str:
    """Two good paraphrases (marker kept where the problem had it), one that drops the marker."""
    a, b = _numbers(problem)
    marker = "[image]" if "[image]" in problem else ""
    return (f"<paraphrase>{marker}Compute {a} plus {b}.</paraphrase>\n"
            f"<paraphrase>{marker}Find the sum of {a} and {b}.</paraphrase>\n"
            f"<paraphrase>Add {b} to {a}.</paraphrase>")


def solve(problem: str) -> str:
    a, b = _numbers(problem)
    total = a + b + (1 if "WRONG" in problem else 0)
    return f"Step 1: Take {a}.\nStep 2: Add {b} to it.\nStep 3: {a} + {b} = {total}.\n\\boxed{{{total}}}"


@pytest.fixture
def chat_server():
    state = ChatServer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            pass

        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}))
            else:
                self._send(404, "{}")

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                self._send(404, "{}")
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(*state.reply(body))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def write_image(path: Path, color: str = "red") -> str:
    Image.new("RGB", (16, 16), color).save(path)
    return str(path)


@pytest.fixture
def jsonl_dataset(tmp_path) -> Path:
    """Six rows in the EasyR1 layout: one with an image, faults scripted by their text, one already done."""
    image = write_image(tmp_path / "img.png")
    rows = [
        {"problem": "<image>What is 2 + 3?", "answer": "5", "images": [image], "subject": "add"},
        {"problem": "What is 4 + 4?", "answer": "8"},
        {"problem": "FLAKY What is 1 + 6?", "answer": "7"},
        {"problem": "SLOW What is 2 + 2?", "answer": "4"},
        {"problem": "GARBAGE What is 3 + 3?", "answer": "6"},
        {"problem": "WRONG What is 5 + 1?", "answer": "6"},
        {"problem": "What is 9 + 9?", "answer": "18", "paraphrases": ["Sum 9 and 9."], "hint_steps": ["Take 9."]},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
