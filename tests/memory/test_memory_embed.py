"""Embedders: offline hashing (deterministic everywhere) and an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiffany.config import Settings
from tiffany.memory import (
    HashingEmbedder,
    OpenAIEmbedder,
    decode_vector,
    embedder_from_settings,
    encode_vector,
)

TEXTS = ["Alice likes green tea", "alice LIKES green tea!", "Bob drives a truck", ""]


def test_hashing_vectors_are_unit_length_and_lexical() -> None:
    vecs = HashingEmbedder().embed(TEXTS)
    assert vecs.shape == (4, 256)
    assert vecs.dtype == np.float32
    norms = np.linalg.norm(vecs, axis=1)
    assert np.allclose(norms[:3], 1.0, atol=1e-5)
    assert norms[3] == 0.0  # no word: no direction
    assert float(vecs[0] @ vecs[1]) > 0.99  # case and punctuation do not count
    assert float(vecs[0] @ vecs[2]) < 0.5


def test_hashing_is_the_same_in_another_process() -> None:
    here = HashingEmbedder(dims=64).embed(TEXTS[:3])
    code = (
        "import sys; from tiffany.memory import HashingEmbedder, encode_vector;"
        "[print(encode_vector(v)) for v in HashingEmbedder(dims=64).embed(sys.argv[1:])]"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *TEXTS[:3]],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
    ).stdout.split()
    assert [decode_vector(line).tolist() for line in out] == [v.tolist() for v in here]


def test_vectors_survive_their_text_encoding() -> None:
    vec = HashingEmbedder().embed(["round trip"])[0]
    assert np.array_equal(decode_vector(encode_vector(vec)), vec)


class _Endpoint(BaseHTTPRequestHandler):
    dims = 8
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), **body}
        )
        data = [
            {"index": i, "embedding": [float(len(text) + 1)] + [1.0] * (self.dims - 1)}
            for i, text in reversed(list(enumerate(body["input"])))
        ]
        raw = json.dumps({"data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Endpoint.seen = []
    _Endpoint.dims = 8
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_openai_compatible_endpoint(endpoint: str) -> None:
    embedder = OpenAIEmbedder(endpoint, "emb-small", api_key="sk-test", dims=8)
    vecs = embedder.embed(["a", "bbb"])
    assert vecs.shape == (2, 8)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    assert vecs[0][0] < vecs[1][0]  # answers put back in order of their index
    assert _Endpoint.seen == [
        {
            "path": "/v1/embeddings",
            "auth": "Bearer sk-test",
            "model": "emb-small",
            "input": ["a", "bbb"],
        }
    ]
    assert embedder.id == "openai:emb-small"
    assert embedder.kind == "openai-compatible endpoint"
    embedder.close()


def test_an_answer_of_other_dimensions_is_refused(endpoint: str) -> None:
    embedder = OpenAIEmbedder(f"{endpoint}/v1", "emb-small", dims=16)
    with pytest.raises(ValueError, match="8 dimensions, not 16"):
        embedder.embed(["x"])
    learning = OpenAIEmbedder(endpoint, "emb-small")
    assert learning.dims == 8  # asked once, fixed from then on
    _Endpoint.dims = 4
    with pytest.raises(ValueError, match="4 dimensions, not 8"):
        learning.embed(["y"])
    embedder.close()
    learning.close()


def test_settings_pick_the_embedder(tmp_path: Path, endpoint: str) -> None:
    offline = embedder_from_settings(Settings(data_dir=tmp_path, _env_file=None))
    assert isinstance(offline, HashingEmbedder)
    assert offline.dims == 256
    small = embedder_from_settings(Settings(data_dir=tmp_path, embeddings_dims=64, _env_file=None))
    assert small.dims == 64
    remote = embedder_from_settings(
        Settings(
            data_dir=tmp_path,
            embeddings_base_url=endpoint,
            embeddings_model="emb-small",
            embeddings_dims=8,
            _env_file=None,
        )
    )
    assert isinstance(remote, OpenAIEmbedder)
    assert remote.embed(["z"]).shape == (1, 8)
    remote.close()
