"""A mock OpenAI-compatible model for the code-agent example: ``POST /v1/chat/completions``.

    python mock_model.py --port 8765            # then TIFFANY_LLM_BASE_URL=http://127.0.0.1:8765

It plays a scripted coding agent, deciding each turn from the conversation
it is sent (as a real model would, with no state of its own): write
``calc.py``, read it back, then answer. It prints ``listening on PORT``
when ready (``--port 0``: a free port) and one ``call N`` line per request,
so a test can count the model calls, and see that a replay makes none.

Standard library only: it stands in for a real endpoint (set
``TIFFANY_LLM_BASE_URL`` and ``TIFFANY_LLM_MODEL`` to one and the same
workflow runs against it).
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CODE = "def add(a, b):\n    return a + b\n"


def move(messages: list[dict[str, str]]) -> dict[str, Any]:
    """The next move of the scripted agent, from how many turns the conversation has had."""
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    last = messages[-1].get("content", "")
    if turns == 0:
        return {"tool": "file.write", "args": {"path": "calc.py", "content": CODE}}
    if turns == 1:
        return {"tool": "file.read", "args": {"path": "calc.py"}}
    if "def add" in last:
        return {"answer": "calc.py defines add(a, b), written and read back."}
    return {"answer": f"something went wrong: {last[:200]}"}


class Handler(BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        Handler.calls += 1
        print(f"call {Handler.calls}", flush=True)
        content = json.dumps(move(body["messages"]))
        reply = json.dumps(
            {
                "id": f"mock-{Handler.calls}",
                "object": "chat.completion",
                "model": body.get("model", "mock"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the "call N" lines are the log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765, help="0: a free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
