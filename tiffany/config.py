"""Tiffany's settings, read from ``TIFFANY_*`` environment variables.

A :class:`Settings` object is built once, at an entry point (a CLI command,
``create_app(settings)`` in tests), and passed down to whatever needs it. There
is deliberately no module-level instance: an import-time ``settings =
Settings()`` freezes the environment at import and stops tests from injecting
their own configuration.

Examples:
    >>> s = Settings(data_dir="/srv/tiffany", _env_file=None)
    >>> s.database_url
    'sqlite:////srv/tiffany/tiffany.db'
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tiffany.wire.redaction import redact_url_credentials
from tiffany.wire.shards import MAX_ENGINES, engine_home

ENV_PREFIX = "TIFFANY_"


def conninfo(url: str) -> str:
    """Return a libpq URI for a SQLAlchemy PostgreSQL URL (``postgresql+psycopg://...``)."""
    if not re.match(r"^postgres(ql)?(\+\w+)?://", url):
        raise ValueError(f"not a PostgreSQL URL: {url.split('@')[-1]!r}")
    return re.sub(r"^postgres(ql)?\+\w+://", "postgresql://", url)


#: File name of the embedded SQLite store inside the data dir.
SQLITE_FILE_NAME = "tiffany.db"

#: Tools a server runs unless its operator says otherwise. ``shell`` is off by
#: default (docs/architecture.md, "Plans"): it has to be enabled on purpose.
DEFAULT_ENABLED_TOOLS: tuple[str, ...] = (
    "agent",
    "file.read",
    "file.write",
    "http",
    "llm",
    "memory.delete",
    "memory.get",
    "memory.link",
    "memory.neighbors",
    "memory.put",
    "memory.search",
    "plan.run",
    "python",
    "signal.wait",
    "sleep",
)

#: Units of ``TIFFANY_RATE_LIMITS`` (``llm=60/min``), in seconds.
RATE_UNITS: dict[str, float] = {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate_limits(text: str) -> dict[str, tuple[int, float]]:
    """``"llm=60/min,http=20/s"`` -> ``{"llm": (60, 60.0), "http": (20, 1.0)}``.

    Raises:
        ValueError: A part that is not ``TOOL=N/UNIT`` (N > 0; UNIT s, min or h).
    """
    out: dict[str, tuple[int, float]] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        tool, sep, rate = part.partition("=")
        count, slash, unit = rate.partition("/")
        if not sep or not tool.strip() or not slash or unit.strip() not in RATE_UNITS:
            raise ValueError(f"{part!r} is not TOOL=N/UNIT (UNIT: s, min or h)")
        try:
            n = int(count)
        except ValueError:
            raise ValueError(f"{part!r}: {count!r} is not a whole number") from None
        if n <= 0:
            raise ValueError(f"{part!r}: the count must be above 0")
        out[tool.strip()] = (n, RATE_UNITS[unit.strip()])
    return out


LogFormat = Literal["auto", "console", "json"]
WalFsync = Literal["always", "batch", "off"]
WalRetain = Literal["all", "archive", "delete"]
JournalBackend = Literal["file", "postgres"]

_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class Settings(BaseSettings):
    """Configuration of a Tiffany process.

    Every field can be set from the environment as ``TIFFANY_<FIELD>`` (for
    example ``TIFFANY_DATA_DIR``), or passed as a keyword argument, which wins.

    Attributes:
        data_dir: Directory of the WAL, the embedded SQLite store and run
            workspaces. Made absolute at construction.
        database_url: SQLAlchemy URL of the store. Empty or unset means the
            embedded SQLite file ``<data_dir>/tiffany.db``; after construction
            it is always a non-empty URL.
        api_token: When set, every HTTP route but ``/healthz`` requires
            ``Authorization: Bearer <token>``.
        host: Address the API binds to.
        port: TCP port the API binds to (0 picks a free one).
        log_format: ``console`` (human), ``json`` (one object a line), or
            ``auto``: console on a terminal, JSON otherwise.
        log_level: Minimum level of log records, a :mod:`logging` level name.
        wal_fsync: WAL durability policy: ``always`` (fsync every record),
            ``batch`` (one fsync per loop iteration, group commit) or ``off``.
        wal_preallocate: Zero-fill the WAL's next segment ahead, off the
            scheduler thread, so that commits overwrite written blocks and
            their fdatasync journals no file-system metadata (a shorter
            commit, for a spare segment of disk).
        wal_retain: What happens to WAL segments whose runs all finished and
            were projected into the store, once a checkpoint covers them:
            ``archive`` (moved to ``<data_dir>/wal/archive/``, still read by
            ``replay --verify`` and ``db rebuild``), ``delete``, or ``all``
            (kept live; start-up still reads only after the checkpoint).
        journal: Where the journal lives: ``file`` (the WAL under
            ``data_dir``, the embedded default) or ``postgres`` (streams of
            rows in the PostgreSQL database of ``database_url``, under a
            fenced lease: docs/pg-journal.md).
        journal_stream: The PostgreSQL stream this engine writes (engine
            ``i`` > 0 writes ``<journal_stream>-<i>``).
        engine: This engine's number among several (``serve --engines N``
            starts engines 0..N-1): its journal's seqs start at ``i << 40``
            (``tiffany/wire/shards.py``). ``serve`` sets it for each engine.
        engines: How many engines ``serve`` starts, and the API reaches
            (their homes under ``data_dir``: docs/engines.md).
        engine_slots: On the PostgreSQL journal, the engine takes the first
            free stream among ``journal_stream``, ``-1``, ... ``-<slots-1>``
            (and becomes that engine), waiting while all are held: N replicas
            of one engine with ``engine_slots=N`` share the work, a spare one
            takes a dead one's stream. 0: the stream of ``engine``.
        journal_lease_s: How long an engine's lease on its stream lasts
            without renewal: a dead engine's stream is taken over after it.
        engine_wait_s: With ``journal=postgres``, how long a submission waits
            for an engine to take it before the API withdraws it and answers
            503 (nothing starts later; retried with its key, it is submitted
            again).
        idempotency_window_s: How long an ``Idempotency-Key`` keeps answering
            the run it started (run start to run start, across restarts).
        slow_dispatch_threshold_s: A task step slower than this many seconds is
            reported by the watchdog.
        enabled_tools: Names of the tools this server may run. From the
            environment: a comma-separated list (``shell,http``) or a JSON list.
        llm_base_url: An OpenAI-compatible endpoint for the ``llm`` and
            ``agent`` tools. Unset, and the scripted provider not asked for,
            their steps fail (``tool.llm.not_configured``).
        llm_model: The model name sent to that endpoint (a step's ``model``
            overrides it); ``scripted`` asks for the offline scripted
            provider. Unset by default.
        llm_api_key: Its bearer key.
        llm_script: A JSON/YAML file of scripted replies; without an endpoint,
            setting it asks for the offline scripted provider.
        shell_sandbox: ``auto`` (bubblewrap; a server refuses shell steps
            without it, ``tiffany run`` falls back with a warning), ``bwrap``
            (required everywhere) or ``none`` (unsandboxed, on purpose: a
            server says so in its log and status). See docs/security.md.
        max_plan_bytes: Largest ``POST /api/runs`` body the API accepts (413
            beyond it, decided before the body is buffered).
        http_header_timeout_s: Seconds a request's headers may take, from the
            connection's opening or the request's first byte (408 and close
            beyond: slow clients, ``tiffany/api/connections.py``).
        http_body_timeout_s: Seconds a request's body may take after its
            headers (408 and close beyond).
        http_max_connections: Connections at once (HTTP and websockets) per
            API process; one more is answered 503 and closed. Lowered to the
            open-file limit less a reserve when that is lower.
        max_signal_bytes: Largest signal payload (``POST
            /api/runs/{id}/signals/{name}`` body) the API accepts (413 beyond).
        max_schedules: Most schedules the store may hold: one more added
            (API or CLI) is refused (429 naming ``TIFFANY_MAX_SCHEDULES``).
        max_pending_signals: Signals a run may hold that no step has received
            yet (sent before their wait, or never waited for); one more is
            refused with 429 until a step takes one or the run ends.
        max_pending_signal_bytes: Bytes of such signals a run may hold (their
            journaled payloads); one more that would pass it is refused with 413.
        max_steps: Steps a run may have, its dynamic steps included: a plan
            with more is refused (422), a dynamic step that would add more
            fails (``limit.max_steps``). Written into each run's first record,
            so its replay applies the bound it ran under.
        max_child_depth: How deep ``plan.run`` children may nest under their
            root run (its children are at depth 1); a ``plan.run`` step past
            it fails (``limit.max_child_depth``).
        max_children: Child runs one run may start (retries included);
            ``limit.max_children`` past it.
        max_descendants: Runs the whole tree of one root run may start;
            ``limit.max_descendants`` past it.
        feed_ring_events: Activity events the API process keeps for websocket
            resumes (its own ring, in front of the engine's).
        ws_queue_frames: Frames a websocket may have queued before it is cut
            off as a slow consumer.
        ws_ping_interval_s: An idle websocket gets a ``ping`` frame this often.
        http_allow: Hosts and CIDRs the ``http`` tool may reach although they
            are loopback, private, link-local... (comma-separated, e.g.
            ``127.0.0.1,10.0.0.0/8,api.internal``; docs/security.md).
        rate_limits: Per-tool rate limits of an engine, ``TOOL=N/UNIT`` comma
            separated (``llm=60/min,http=20/s``): a step of the tool starts
            no sooner than the limit allows (tiffany/agents/rate_limits.py).
        ws_max_subscribers: Websockets on ``/ws/activity`` at once per API
            process; one more is accepted and closed at once with code 1013
            (try again later).
        ws_queue_bytes: Bytes of frames a websocket may have queued before it
            is cut off as a slow consumer (beside ``ws_queue_frames``).
        ws_send_timeout_s: How long one send to a websocket may wait for its
            socket to drain before it is cut off.
        ws_cutoff_linger_s: How long a cut-off websocket's socket may take to
            accept its ``cutoff`` and close frames (queued behind its
            backlog) before the connection is reset.
        projector_nice: How much lower the projector process runs than its
            engine: its niceness is raised by this much, and above 0 it runs
            as a batch process (``SCHED_BATCH``) while no read waits on the
            store (``engine/projector_proc.py``: ``Priority``). The projector
            catches up in batches, so when both cores are busy the submission
            path (the engine and the API) gets the CPU first
            (bench/HISTORY.md). 0: the engine's priority.
        tool_modules: Python modules an engine imports at start, so that
            their ``@python_tool`` functions register without packaging
            (``mytools,pkg.more``: comma-separated or a JSON list; the
            working directory is importable, as with ``python -m``). The
            CLI's ``--import MOD`` adds to them.
        traceback_frames: Frames of a failed ``python`` function's traceback
            its step's error keeps (outside the tiffany package; the
            innermost ones): ``tiffany/agents/tracebacks.py``.
        traceback_chars: Characters each frame's file, function and source
            line keep there.
        memory_max_items: Items one memory namespace may hold; a put of one
            more is refused (``memory.full``: docs/memory.md).
        memory_pgvector: ``auto``: on PostgreSQL whose database has pgvector
            (``tiffany db pgvector``), memory's vector search runs in SQL;
            ``off``: always exactly in the process (docs/memory.md).
        embeddings_base_url: An OpenAI-compatible endpoint the MemoryStore
            embeds text with (``POST {base_url}/v1/embeddings``). Unset: the
            offline feature-hashing embedder (docs/memory.md).
        embeddings_model: The model name sent to that endpoint.
        embeddings_api_key: Its bearer key.
        embeddings_dims: The vectors' length: the endpoint's answers are
            checked against it (unset: the first answer's length); the
            offline embedder's dimensions (unset: 256).
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=None,
        extra="ignore",
        validate_default=True,
    )

    data_dir: Path = Path(".tiffany")
    database_url: str = ""
    api_token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_format: LogFormat = "auto"
    log_level: str = "INFO"
    wal_fsync: WalFsync = "batch"
    wal_preallocate: bool = True
    wal_retain: WalRetain = "archive"
    journal: JournalBackend = "file"
    journal_stream: str = Field(default="main", min_length=1, max_length=64)
    journal_lease_s: float = Field(default=10.0, gt=0)
    engine: int = Field(default=0, ge=0, lt=MAX_ENGINES)
    engines: int = Field(default=1, ge=1, le=MAX_ENGINES)
    engine_slots: int = Field(default=0, ge=0, le=MAX_ENGINES)
    engine_wait_s: float = Field(default=10.0, gt=0, le=3_600.0)
    idempotency_window_s: float = Field(default=86_400.0, gt=0)
    slow_dispatch_threshold_s: float = Field(default=0.1, gt=0)
    enabled_tools: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_ENABLED_TOOLS)
    )
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    llm_script: Path | None = None
    shell_sandbox: Literal["auto", "bwrap", "none"] = "auto"
    max_plan_bytes: int = Field(default=1_048_576, gt=0)
    max_signal_bytes: int = Field(default=262_144, gt=0)
    max_schedules: int = Field(default=10_000, gt=0)
    max_pending_signals: int = Field(default=100, gt=0)
    max_pending_signal_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_steps: int = Field(default=10_000, gt=0)
    max_child_depth: int = Field(default=8, gt=0)
    max_children: int = Field(default=500, gt=0)
    max_descendants: int = Field(default=1000, gt=0)
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    http_body_timeout_s: float = Field(default=60.0, gt=0)
    http_max_connections: int = Field(default=10_000, gt=0)
    feed_ring_events: int = Field(default=100_000, gt=0)
    ws_queue_frames: int = Field(default=10_000, gt=0)
    ws_ping_interval_s: float = Field(default=15.0, gt=0)
    http_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    ws_max_subscribers: int = Field(default=1000, gt=0)
    rate_limits: str = ""
    ws_queue_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    ws_send_timeout_s: float = Field(default=10.0, gt=0)
    ws_cutoff_linger_s: float = Field(default=10.0, gt=0)
    tool_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    projector_nice: int = Field(default=10, ge=0, le=19)
    # tiffany/agents/tracebacks.py's DEFAULT_TRACEBACK_FRAMES and _CHARS (a test holds them equal)
    traceback_frames: int = Field(default=30, gt=0)
    traceback_chars: int = Field(default=240, ge=16)
    memory_max_items: int = Field(default=100_000, gt=0)
    memory_pgvector: Literal["auto", "off"] = "auto"
    embeddings_base_url: str | None = None
    embeddings_model: str | None = None
    embeddings_api_key: SecretStr | None = None
    embeddings_dims: int | None = Field(default=None, gt=0, le=8192)

    @field_validator("rate_limits", mode="after")
    @classmethod
    def _check_rate_limits(cls, value: str) -> str:
        parse_rate_limits(value)  # raises ValueError naming the bad part
        return value

    @field_validator("data_dir", mode="after")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @field_validator("database_url", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("llm_model", "llm_base_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # ``TIFFANY_LLM_MODEL=`` (docker-compose's ``${VAR:-}``) means "not set".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        # docker-compose's ``${TIFFANY_API_TOKEN:-}`` yields an empty string:
        # that means "no token", not "the empty token".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_log_level(cls, value: Any) -> Any:
        if isinstance(value, int):
            value = logging.getLevelName(value)
        if isinstance(value, str):
            value = value.strip().upper()
            if value not in _LOG_LEVELS:
                choices = ", ".join(_LOG_LEVELS)
                raise ValueError(f"unknown log level {value!r}; use one of {choices}")
        return value

    @field_validator("enabled_tools", "http_allow", "tool_modules", mode="before")
    @classmethod
    def _split_tools(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [name.strip() for name in text.split(",") if name.strip()]
        return value

    @model_validator(mode="after")
    def _derive_database_url(self) -> Settings:
        if not self.database_url.strip():
            path = self.data_dir / SQLITE_FILE_NAME
            self.database_url = f"sqlite:///{path}"
        if self.engine_slots and self.journal != "postgres":
            raise ValueError(
                "engine_slots needs journal=postgres: engines take free streams of the database"
            )
        if self.journal == "postgres" and not self.database_url.startswith("postgres"):
            raise ValueError(
                "journal=postgres needs a PostgreSQL database_url "
                "(TIFFANY_DATABASE_URL=postgresql+psycopg://...): the journal lives there"
            )
        return self

    def for_engine(self, engine: int) -> Settings:
        """Return the settings of engine ``engine`` of this data dir (``serve --engines N``).

        Its data dir is the engine's home (its WAL, sockets, workspaces:
        ``tiffany/wire/shards.py``); the store stays this data dir's.
        """
        if engine == self.engine:
            return self
        root = self.data_dir if self.engine == 0 else self.data_dir.parent.parent
        return self.model_copy(update={"data_dir": engine_home(root, engine), "engine": engine})

    @property
    def log_level_number(self) -> int:
        """The :mod:`logging` level number of :attr:`log_level`."""
        level: int = logging.getLevelNamesMapping()[self.log_level]
        return level

    def public_dict(self) -> dict[str, Any]:
        """Return the settings as JSON-able data with secrets masked.

        Passwords inside ``database_url`` are masked too, so the result can be
        logged or printed.
        """
        data = self.model_dump(mode="json")
        data["api_token"] = "**********" if self.api_token is not None else None
        data["llm_api_key"] = "**********" if self.llm_api_key is not None else None
        data["embeddings_api_key"] = "**********" if self.embeddings_api_key is not None else None
        data["database_url"] = redact_url_credentials(self.database_url)
        return data


_SECRET_NAME = ("TOKEN", "KEY", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")


def is_secret_name(name: str) -> bool:
    """True for an environment variable whose name says it holds a secret.

    ``*_TOKEN``, ``*_KEY``, ``*PASSWORD*``, ``*SECRET*``... (case-insensitive),
    but not PostgreSQL's ``PG*`` variables (the store's client reads them).
    """
    upper = name.upper()
    if upper.startswith("PG"):
        return False
    return any(part in upper for part in _SECRET_NAME)


def scrub_secrets(env: dict[str, str], keep: tuple[str, ...] = ()) -> dict[str, str]:
    """Return ``env`` without the secret-looking variables, but those in ``keep``.

    Each process gets only the secrets it uses (docs/security.md): the API
    its token, the engine the LLM key, the projector neither.
    """
    return {k: v for k, v in env.items() if k in keep or not is_secret_name(k)}
