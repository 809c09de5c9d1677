"""``looptrace demo``: a small traced async evaluation, written into the local store.

A toy question-answering agent (parse, retrieve, generate: nested spans) answers capital-city
questions, four at a time, under a lag monitor. On purpose, one case fails (a country the
"knowledge base" does not know), one answer is wrong, and one step blocks the event loop for a
few milliseconds with a synchronous call, so every view has something to show.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import IO, Any

import looptrace
from looptrace._config import Config

# Imported here, before the demo's loop runs, not on first use inside it: loading looptrace's
# evaluations (and the anyio backend they bring) takes 50-150 ms, which on the loop would be the
# worst stall of a demo meant to show the user's.
from looptrace.evals import experiment
from looptrace.monitor import LagMonitor

__all__ = ["DEMO_EXPERIMENT", "build_dataset", "run_demo"]

DEMO_EXPERIMENT = "capitals-demo"

_CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Canada": "Ottawa",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Chile": "Santiago",
    "Vietnam": "Hanoi",
    "Ghana": "Accra",
}
# The model's one mistake, and the country it has never heard of.
_WRONG = {"Australia": "Sydney"}
_UNKNOWN = "Atlantis"
_BLOCKING_COUNTRY = "Japan"


def build_dataset(cases: int) -> list[dict[str, Any]]:
    """``cases`` questions (at least 2): the failing one third, the wrong answer fourth."""
    countries = list(_CAPITALS)
    picked: list[str] = []
    for i in range(cases):
        if i == 2:
            picked.append(_UNKNOWN)
        elif i == 3:
            picked.append("Australia")
        else:
            picked.append(countries[len(picked) % len(countries)])
    truth = {**_CAPITALS, "Australia": "Canberra", _UNKNOWN: "unknown"}
    return [
        {"input": {"question": f"What is the capital of {c}?"}, "expected": truth[c]}
        for c in picked
    ]


@looptrace.traced
async def parse(question: str) -> str:
    """Pull the country out of the question."""
    await asyncio.sleep(0.002)
    return question.removeprefix("What is the capital of ").rstrip("?")


@looptrace.traced
async def retrieve(country: str) -> list[str]:
    """Look the country up in the knowledge base (fails for a country it does not know)."""
    await asyncio.sleep(0.01 + 0.002 * (len(country) % 5))
    if country == _UNKNOWN:
        raise LookupError(f"no documents about {country!r}")
    capital = _WRONG.get(country) or _CAPITALS[country]
    return [f"{capital} is the capital of {country}.", f"{country} is a country."]


@looptrace.traced
async def generate(question: str, documents: list[str]) -> str:
    """Write the answer from the retrieved documents."""
    await asyncio.sleep(0.02)
    if _BLOCKING_COUNTRY in question:
        # A synchronous call inside async code: it holds the event loop, and the lag monitor
        # charges the spans that were open at the time.
        time.sleep(0.015)  # noqa: ASYNC251 - the point of the demo
    return documents[0].split(" is the capital")[0]


@looptrace.traced
async def answer(case_input: dict[str, str]) -> str:
    """The agent: parse, retrieve, generate."""
    country = await parse(case_input["question"])
    documents = await retrieve(country)
    return await generate(case_input["question"], documents)


def exact_match(output: Any, expected: Any) -> bool:
    """1.0 when the answer is the expected capital."""
    return isinstance(output, str) and output.strip().lower() == str(expected).lower()


def brevity(output: Any) -> float:
    """1.0 for an answer of up to 10 characters, less for longer ones."""
    return min(1.0, 10 / max(1, len(str(output))))


async def _run(cases: int, out: IO[str]) -> looptrace.Experiment:
    dataset = build_dataset(cases)
    # summary_interval: the monitor writes a looptrace.loop.lag summary span every 100 ms. It
    # watches the cases only, as the experiment's own figures do (its summary's "worst stall"),
    # so the summary and the viewer's cards speak of the same stretch of time.
    async with (
        experiment(
            DEMO_EXPERIMENT, metadata={"agent": "toy", "cases": cases}, tags=["demo"], stream=out
        ) as exp,
        LagMonitor(interval=0.002, summary_interval=0.1, culprits=True, culprit_threshold=0.01),
    ):
        await exp.run(answer, dataset, scorers=[exact_match, brevity], concurrency=4)
    return exp


def _command() -> str:
    """How the user can run looptrace again from where they are: ``looptrace`` when that is
    on PATH and is this program, else the path they ran (``.venv/bin/looptrace`` when the
    virtualenv is not activated), else this interpreter with ``-m looptrace.cli``."""
    import os
    import shutil

    ran = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if os.path.basename(ran) in ("looptrace", "looptrace.exe"):
        found = shutil.which("looptrace")
        try:
            if found is not None and os.path.samefile(found, ran):
                return "looptrace"
        except OSError:
            pass
        relative = os.path.relpath(ran)
        shown = relative if not relative.startswith("..") else ran
        return shlex.quote(shown if os.sep in shown else os.path.join(".", shown))
    return f"{shlex.quote(sys.executable)} -m looptrace.cli"


def _has_server_extra() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn"))


DEMO_SERVICE = "looptrace-demo"


def run_demo(store_path: Path, cases: int = 8, out: IO[str] | None = None) -> looptrace.Experiment:
    """Run the demo into the store at ``store_path``, print the experiment summary and how to
    look at the result; return the finished experiment."""
    out = out or sys.stdout
    # The demo always writes to the local store, even when an endpoint is configured, and
    # under a service name of its own (unless the user set one), so that its traces can be
    # told apart from a project's and pruned: `looptrace prune --service looptrace-demo`.
    overrides: dict[str, object] = {"endpoint": None, "store_path": store_path}
    cfg = Config.from_env()
    if cfg.service_name == "unknown_service" and not cfg.resource_attributes.get("service.name"):
        overrides["service_name"] = DEMO_SERVICE
    looptrace.configure(**overrides)
    try:
        exp = asyncio.run(_run(cases, out))
    finally:
        looptrace.shutdown_sync()
    failed = next((r for r in exp.results if r.error is not None), None)
    example = failed.trace_id if failed is not None else exp.results[0].trace_id
    cmd = _command()
    if Path(store_path) != Config.from_env().store_path:
        cmd += f" --store {shlex.quote(str(store_path))}"
    hints = [
        (f"{cmd} traces", "recent traces"),
        (f"{cmd} show {example[:12]}", "the failing case, as a span tree"),
        (f"{cmd} experiments {exp.id[:12]}", "every case and its scores"),
        (f"{cmd} serve", "all of it in a browser at http://localhost:4318"),
    ]
    if not _has_server_extra():
        from ._install import install_hint

        hints.append(("", f"(serve needs the server extra: {install_hint('server')})"))
    width = max(len(c) for c, _ in hints) + 3
    out.write(f"\nThe traces are in {store_path}. Look at them:\n")
    out.write("".join(f"  {c:<{width}}{d}\n" for c, d in hints))
    out.flush()
    return exp
