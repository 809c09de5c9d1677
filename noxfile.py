"""The project's whole workflow: ``nox -s tests lint typecheck bench docs``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
# Every CPython the package supports; CI has each of them (.ci/run puts them on PATH).
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]


# The client's and the collector's tests, run once more on uvloop (what uvicorn runs whenever
# it is installed): tests/conftest.py reads LOOPTRACE_TEST_LOOP.
UVLOOP_TESTS = [
    "tests/_capture/test_capture.py",
    "tests/_export/test_pipeline.py",
    "tests/_export/test_pipeline_faults.py",
    "tests/_export/test_pipeline_lifecycle.py",
    "tests/_export/test_buffer_threads.py",
    "tests/_export/test_exporters.py",
    "tests/_transport/test_http1.py",
    "tests/_export/test_client_bounds.py",
    "tests/_transport/test_transport_edges.py",
    "tests/_offload/test_offload_send.py",
    "tests/collector/test_collector.py",
    "tests/collector/test_collector_bounds.py",
    "tests/collector/test_collector_edges.py",
    "tests/evals/test_evals.py",
    "tests/monitor/test_monitor.py",
    "tests/otel/test_otel.py",
]
UVLOOP_PYTHON = "3.13"


@nox.session(python=SUPPORTED)
def tests(session: nox.Session) -> None:
    """The test suite on every supported Python (the README's test command runs this), and
    on one of them the client's and the collector's tests on uvloop too."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *(session.posargs or ["-q"]))
    if not session.posargs and session.python == UVLOOP_PYTHON:
        session.run(
            "python",
            "-m",
            "pytest",
            "-q",
            *UVLOOP_TESTS,
            env={"LOOPTRACE_TEST_LOOP": "uvloop"},
        )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and the import layers (pyproject's importlinter)."""
    session.install("ruff>=0.5")
    # No cache: a cached verdict from an older tree must not hide what a clean clone sees.
    session.run("ruff", "check", "--no-cache", "src", "tests", "benchmarks", "noxfile.py")
    session.run(
        "ruff", "format", "--check", "--no-cache", "src", "tests", "benchmarks", "noxfile.py"
    )
    # lint-imports reads the installed package: the contracts name its modules.
    session.install("-e", ".[test]", "import-linter>=2.1")
    session.run("lint-imports")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, plus the typing test file that pins decorator types."""
    session.install("-e", ".[test]", "mypy>=1.10")
    session.run("mypy", "src/looptrace")
    session.run("mypy", "--strict", "--python-version", "3.11", "tests/typing/api.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """pytest-benchmark micro-benchmarks, then the scenario scripts (each prints its table)."""
    session.install("-e", ".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        "benchmarks",
        "-q",
        "--benchmark-only",
        "--benchmark-columns=min,median,mean,ops",
        "-p",
        "no:randomly",
    )
    import glob

    for script in sorted(glob.glob("benchmarks/scenario_*.py")):
        session.run("python", script)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Strict docs build: every page in docs/ must be reachable and every link must resolve."""
    session.install("mkdocs>=1.5")
    session.run("mkdocs", "build", "--strict", "--site-dir", "build/site")


# A real Arize Phoenix installs about 150 packages (its own OpenTelemetry pins among them): a
# session of its own, apart from `tests`, on one Python in the middle of Phoenix's range
# (3.11-3.14) that CI has.
INTEROP_PYTHON = "3.12"


@nox.session(python=INTEROP_PYTHON)
def interop(session: nox.Session) -> None:
    """looptrace's spans read back from a real Arize Phoenix started on 127.0.0.1
    (tests/interop: span kinds, session and user, token counts, cost, scores)."""
    # pip spends 3-6 minutes on Phoenix's packages on a busy 2-core machine; uv, which pip
    # installs in seconds, about 30 s from an empty cache.
    session.install("uv>=0.5")
    session.run(
        "uv",
        "pip",
        "install",
        "-e",
        ".[genai]",
        "arize-phoenix>=20.26",
        "openai>=1.66",
        "pytest>=8.0",
        "pytest-asyncio>=0.23",
        env={"VIRTUAL_ENV": session.virtualenv.location},
    )
    session.run("python", "-m", "pytest", "-q", "-rP", "tests/interop", *session.posargs)


@nox.session(python=PYTHON)
def agents(session: nox.Session) -> None:
    """The agent-framework integrations (looptrace.integrations) with the frameworks
    themselves: the OpenAI Agents SDK, LangChain and LangGraph, pydantic-ai and LiteLLM
    (tests/integrations). The `agents` extra brings about 55 packages beyond `test` (a fresh session
    takes about 8 minutes here, most of it installing), so it has a session of its own, on one
    Python, apart from `tests`."""
    session.install("-e", ".[test,agents]")
    # LiteLLM fetches its price map from the network at import unless told to use its own copy.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    session.run("python", "-m", "pytest", "-q", "tests/integrations", *session.posargs, env=env)
