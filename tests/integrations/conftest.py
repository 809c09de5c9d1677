"""The agent-framework integrations' tests (``nox -s agents``), with the frameworks themselves.

The frameworks are not in the ``test`` extra (the ``agents`` extra brings them): a file is
collected only where its framework is installed, so ``nox -s tests`` on a machine without them
skips this folder, and ``nox -s agents`` installs them and runs it alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

# LiteLLM fetches its model price map from the network when it is imported, unless told to
# use the copy it ships.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

sys.path.insert(0, str(Path(__file__).parent))

# Each file and the distribution it needs (asked of the installed distributions: importing
# each framework to find out would cost seconds at every collection).
_NEEDS = {
    "test_openai_agents.py": "openai-agents",
    "test_langchain.py": "langchain-core",
    "test_langgraph.py": "langgraph",
    "test_pydantic_ai.py": "pydantic-ai-slim",
    "test_litellm.py": "litellm",
}


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


collect_ignore_glob = [name for name, needed in _NEEDS.items() if not _installed(needed)]


@pytest.fixture(autouse=True, scope="session")
def _prices() -> None:
    """The price table loaded before any test's event loop runs, as an application that
    instruments at start-up has it (a handler made on a loop loads it in a thread)."""
    from looptrace.integrations import _common

    _common.load_prices()


@pytest.fixture
def no_blocking() -> Iterator[None]:
    """Fails the test when looptrace's code makes a blocking call (a sleep, a blocking socket
    or file operation) while an application's event loop runs: the frameworks call these
    integrations on their loop."""
    from blocking import no_blocking_on_the_loop

    with no_blocking_on_the_loop():
        yield
