"""The public API is what ``looptrace`` exports on purpose: this list changes only by a
deliberate edit, and every exported name is real and documented."""

from __future__ import annotations

import importlib
import pathlib

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
    "Statistics",
    "__version__",
    "attach",
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
    "run_experiment",
    "shutdown",
    "shutdown_sync",
    "span",
    "statistics",
    "suppress_tracing",
    "traced",
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
    for module in ("looptrace.testing", "looptrace.monitor", "looptrace.evals"):
        importlib.import_module(module)
