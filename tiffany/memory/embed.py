"""Embedders: text to L2-normalised float32 vectors, computed once, at a write.

A put's vector is computed before its transaction and travels in its result
(:func:`encode_vector`), so the journal holds it: a replay or a rebuild
never calls the model again (``MemoryStore.apply``).

Two embedders:

* :class:`HashingEmbedder`, the offline default: signed feature hashing
  (Weinberger et al.) of lower-cased word unigrams and bigrams and of each
  word's character 3-grams, hashed with ``blake2b`` (never the per-process
  salted ``hash()``), so the same text gives the same vector in every
  process and on every machine. It is real (texts that share words and
  spellings score higher) but lexical: it knows no synonyms. Its ``kind``
  says so wherever its vectors are used.
* :class:`OpenAIEmbedder`: an OpenAI-compatible ``/v1/embeddings`` endpoint
  (``TIFFANY_EMBEDDINGS_BASE_URL``), its answers checked for their length.

Invariant: every vector an embedder returns has unit L2 norm, or is all zeros
(a text with no word), so a dot product is the cosine.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import httpx
import numpy as np

if TYPE_CHECKING:
    from tiffany.config import Settings

__all__ = [
    "DEFAULT_DIMS",
    "Embedder",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "decode_vector",
    "describe",
    "embedder_from_settings",
    "encode_vector",
    "normalize",
]

#: The offline embedder's dimensions unless configured.
DEFAULT_DIMS: Final = 256
#: Weights of the hashed features: a word, a pair of words, a word's 3-gram.
_UNIGRAM_WEIGHT: Final = 1.0
_BIGRAM_WEIGHT: Final = 0.7
_TRIGRAM_WEIGHT: Final = 0.35
_WORD: Final = re.compile(r"\w+", re.UNICODE)
#: Texts an :class:`OpenAIEmbedder` sends in one request.
EMBED_BATCH: Final = 64
#: Seconds an embeddings request may take.
EMBED_TIMEOUT_S: Final = 30.0


@runtime_checkable
class Embedder(Protocol):
    """What the MemoryStore needs from an embedder.

    ``id`` names the model and its version: vectors of different ids are
    never compared (a search uses its store's embedder's only); ``dims`` is
    the vectors' length; ``kind`` says what it is, for people (``"offline
    feature hashing"``).
    """

    @property
    def id(self) -> str:
        """The model and its version."""
        ...

    @property
    def dims(self) -> int:
        """The vectors' length."""
        ...

    @property
    def kind(self) -> str:
        """What it is, for people."""
        ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return a float32 array ``[len(texts), dims]`` of L2-normalised rows."""
        ...


def describe(embedder: Embedder) -> dict[str, Any]:
    """The ``{"id", "dims", "kind"}`` of ``embedder`` that answers carry."""
    return {"id": embedder.id, "dims": embedder.dims, "kind": embedder.kind}


def normalize(rows: np.ndarray) -> np.ndarray:
    """Return ``rows`` as float32 with each row scaled to unit length (zero rows stay zero)."""
    out = np.ascontiguousarray(rows, dtype=np.float32)
    if out.ndim == 1:
        out = out.reshape(1, -1)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: np.ndarray = (out / norms).astype(np.float32, copy=False)
    return result


def encode_vector(vec: np.ndarray) -> str:
    """Base64 of ``vec`` as float32 little-endian (how results and the journal carry it)."""
    return base64.b64encode(np.asarray(vec, dtype="<f4").reshape(-1).tobytes()).decode("ascii")


def decode_vector(text: str) -> np.ndarray:
    """The float32 vector :func:`encode_vector` encoded."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


@functools.lru_cache(maxsize=1 << 17)
def _slot(feature: str, dims: int) -> tuple[int, float]:
    """The index and sign of a feature: 8 bytes of its blake2b, stable everywhere."""
    h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return h % dims, (1.0 if h >> 63 else -1.0)


class HashingEmbedder:
    """Offline, deterministic feature hashing: no model, no network.

    Args:
        dims: The vectors' length (256 by default).
    """

    kind: str = "offline feature hashing"

    def __init__(self, dims: int = DEFAULT_DIMS) -> None:
        if not 8 <= dims <= 8192:
            raise ValueError(f"dims must be within 8..8192, not {dims}")
        self.dims = dims
        self.id = f"hashing-blake2b-v1-{dims}"

    def __repr__(self) -> str:
        return f"HashingEmbedder(dims={self.dims})"

    def features(self, text: str) -> dict[str, float]:
        """The weighted features of ``text`` (words, word pairs, each word's 3-grams).

        The definition :meth:`embed` computes faster (a word's slots cached).
        """
        words = _WORD.findall(text.lower())
        out: dict[str, float] = {}
        for i, word in enumerate(words):
            for key, weight in _word_features(word):
                out[key] = out.get(key, 0.0) + weight
            if i:
                key = f"b:{words[i - 1]} {word}"
                out[key] = out.get(key, 0.0) + _BIGRAM_WEIGHT
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return the L2-normalised vectors of ``texts``, one row each."""
        dims = self.dims
        out = np.zeros((len(texts), dims), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            if not words:
                continue
            slots: list[int] = []
            weights: list[float] = []
            previous = ""
            for i, word in enumerate(words):
                word_slots, word_weights = _word_slots(word, dims)
                slots.extend(word_slots)
                weights.extend(word_weights)
                if i:
                    index, sign = _slot(f"b:{previous} {word}", dims)
                    slots.append(index)
                    weights.append(sign * _BIGRAM_WEIGHT)
                previous = word
            out[row] = np.bincount(slots, weights=weights, minlength=dims)
        return normalize(out)


def _word_features(word: str) -> list[tuple[str, float]]:
    """A word's own features: itself, and the 3-grams of ``<word>``."""
    padded = f"<{word}>"
    found = [("w:" + word, _UNIGRAM_WEIGHT)]
    found.extend(("c:" + padded[j : j + 3], _TRIGRAM_WEIGHT) for j in range(len(padded) - 2))
    return found


@functools.lru_cache(maxsize=1 << 16)
def _word_slots(word: str, dims: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A word's features as (slots, signed weights): computed once per word and dims."""
    slots: list[int] = []
    weights: list[float] = []
    for feature, weight in _word_features(word):
        index, sign = _slot(feature, dims)
        slots.append(index)
        weights.append(sign * weight)
    return tuple(slots), tuple(weights)


def embeddings_url(base_url: str) -> str:
    """``{base}/v1/embeddings`` for a base URL given with or without its ``/v1``."""
    base = base_url.rstrip("/")
    return f"{base if base.endswith('/v1') else base + '/v1'}/embeddings"


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint.

    Args:
        base_url: The endpoint's base URL (``http://host:8080`` or ``.../v1``).
        model: The model name sent with each request.
        api_key: Its bearer key, if any.
        dims: The vectors' length; an answer of another length fails the
            write (``ValueError``). None: the first answer's length, fixed
            from then on.
        client: An ``httpx.Client`` to send with (tests); one of its own otherwise.
    """

    kind: str = "openai-compatible endpoint"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        dims: int | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = embeddings_url(base_url)
        self.model = model
        self.id = f"openai:{model}"
        self._dims = dims
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(timeout=EMBED_TIMEOUT_S, headers=headers)

    @property
    def dims(self) -> int:
        """The vectors' length (asks the endpoint once if it was not configured)."""
        if self._dims is None:
            self.embed(["dimensions"])
        assert self._dims is not None
        return self._dims

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return the endpoint's vectors of ``texts``, L2-normalised, in order."""
        rows: list[list[float]] = []
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            answer = self._client.post(self.url, json={"model": self.model, "input": batch})
            answer.raise_for_status()
            data = sorted(answer.json()["data"], key=lambda d: int(d["index"]))
            if len(data) != len(batch):
                raise ValueError(f"{self.url} answered {len(data)} vectors for {len(batch)} texts")
            rows.extend(d["embedding"] for d in data)
        if not rows:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        out = np.asarray(rows, dtype=np.float32)
        if self._dims is None:
            self._dims = int(out.shape[1])
        if out.shape[1] != self._dims:
            raise ValueError(f"{self.url} answered {out.shape[1]} dimensions, not {self._dims}")
        return normalize(out)

    def close(self) -> None:
        """Close its HTTP client."""
        self._client.close()


def embedder_from_settings(settings: Settings) -> Embedder:
    """The embedder ``settings`` ask for: the endpoint when configured, else offline hashing."""
    if settings.embeddings_base_url:
        key = settings.embeddings_api_key
        return OpenAIEmbedder(
            settings.embeddings_base_url,
            settings.embeddings_model or "text-embedding-3-small",
            api_key=key.get_secret_value() if key is not None else None,
            dims=settings.embeddings_dims,
        )
    return HashingEmbedder(settings.embeddings_dims or DEFAULT_DIMS)
