"""The public API is what ``looptrace`` exports on purpose: this list changes only by a
deliberate edit, and every exported name is real and documented."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

import looptrace

EXPECTED = {
    "CaseResult",
    "Config",
    "ConfigurationError",
    "Culprit",
    "Event",
    "Experiment",
    "ExperimentSummary",
    "FlushResult",
    "LagMonitor",
    "LagSnapshot",
    "Link",
    "LoopTraceError",
    "NonRecordingSpan",
    "Score",
    "Span",
    "SpanContext",
    "SpanKind",
    "StatusCode",
    "OffloadStatistics",
    "Statistics",
    "__version__",
    "attach",
    "attributes",
    "backpressure",
    "bind_context",
    "configure",
    "current_span",
    "experiment",
    "extract",
    "flush",
    "flush_sync",
    "get_config",
    "inject",
    "instrument_anthropic",
    "instrument_openai",
    "instrument_opentelemetry",
    "run_experiment",
    "shutdown",
    "shutdown_on_signal",
    "shutdown_sync",
    "score",
    "span",
    "statistics",
    "suppress_tracing",
    "traced",
    "uninstrument_anthropic",
    "uninstrument_openai",
    "uninstrument_opentelemetry",
}


def test_exported_names_are_exactly_the_intended_ones() -> None:
    """Adding or removing a public name fails here until this list is updated on purpose."""
    assert set(looptrace.__all__) == EXPECTED


def test_every_export_exists_and_is_not_private() -> None:
    """Each name in __all__ resolves, and none of them is a private module object."""
    for name in looptrace.__all__:
        obj = getattr(looptrace, name)
        if name != "__version__":
            assert not name.startswith("_")
            assert getattr(obj, "__doc__", None), f"{name} has no docstring"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_package_roots_export_public_names_only() -> None:
    """Every package's ``__init__`` offers its public names only: a private name is imported
    from the module that defines it, never re-exported from a package root (by an explicit
    ``import x as x`` or through ``__all__``)."""
    root = pathlib.Path(looptrace.__file__).parent
    found: dict[str, list[str]] = {}
    for init in sorted(root.rglob("__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        names: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                names += [a.name for a in node.names if a.asname == a.name and _private(a.name)]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names += [
                    e.value
                    for e in getattr(node.value, "elts", [])
                    if isinstance(e, ast.Constant) and _private(str(e.value))
                ]
        if names:
            found[str(init.relative_to(root))] = names
    assert found == {}


def test_public_names_are_mentioned_in_the_docs() -> None:
    """Every exported callable or class appears somewhere in docs/ or the README."""
    root = pathlib.Path(__file__).parent.parent
    text = (root / "README.md").read_text() + "".join(
        p.read_text() for p in (root / "docs").glob("*.md")
    )
    missing = [n for n in EXPECTED - {"__version__"} if n not in text]
    assert missing == []


def test_package_ships_type_information() -> None:
    """py.typed is present, so type checkers read looptrace's annotations."""
    package = pathlib.Path(looptrace.__file__).parent
    assert (package / "py.typed").exists()


def test_public_modules_import() -> None:
    """The public modules outside the top-level namespace import on their own."""
    for module in ("looptrace.testing", "looptrace.monitor", "looptrace.evals", "looptrace.otel"):
        importlib.import_module(module)


def test_public_modules_are_attributes_after_a_plain_import() -> None:
    """``looptrace.monitor.ensure_from_config()`` (and ``looptrace.evals``, ``looptrace.testing``)
    work after a plain ``import looptrace``, each loaded on first use."""
    code = (
        "import sys, looptrace\n"
        "assert 'looptrace.monitor' not in sys.modules\n"
        "print(looptrace.monitor.ensure_from_config())\n"
        "print(looptrace.evals.experiment is looptrace.experiment, looptrace.testing.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "True", "looptrace.testing"]


def test_importing_the_package_loads_nothing_else() -> None:
    """``import looptrace`` costs almost nothing: each public name loads its module on first
    use, so a worker process (or a program using one part of the API) pays only for that."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import looptrace\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "print(' '.join(loaded))\n"
        "looptrace.traced\n"
        "print('looptrace._export' in sys.modules)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded, pipeline_loaded, otel_loaded = out.stdout.split("\n")[:3]
    assert [m for m in loaded.split() if m.startswith("looptrace.")] == []
    assert not {"asyncio", "httpx", "orjson", "opentelemetry"} & set(loaded.split())
    # The capture API brings the export pipeline with it, so the first span (perhaps on the
    # user's loop) does not import it.
    assert pipeline_loaded == "True"
    # The OpenTelemetry bridge is an optional extra: the capture API never imports it.
    assert otel_loaded == "[]"


def test_lazy_names_match_the_names_type_checkers_see() -> None:
    """Each public name resolves from the module the type checkers are told it comes from."""
    tree = ast.parse(pathlib.Path(looptrace.__file__).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module is not None
                seen.update({alias.name: stmt.module for alias in stmt.names})
    assert seen == looptrace._ORIGIN
    assert set(seen) == set(looptrace.__all__) - {"__version__"}
    for name, module in seen.items():
        origin = importlib.import_module(f"looptrace.{module}")
        assert getattr(looptrace, name) is getattr(origin, name)


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'trace'"):
        looptrace.trace  # noqa: B018
    assert "traced" in dir(looptrace)
