"""A real Arize Phoenix server for the interoperability tests (``nox -s interop``).

Phoenix is a large install (about 150 packages), so it is not in the ``test`` extra: these
tests are collected only where ``arize-phoenix`` is installed. The interop session runs
``pytest tests/interop`` alone, so a Phoenix that failed to install shows there as no test
run (pytest's exit status 5), never as a pass.
"""

from __future__ import annotations

from importlib import metadata

try:
    metadata.version("arize-phoenix")
except metadata.PackageNotFoundError:
    collect_ignore_glob = ["test_*.py"]
else:
    from phoenix_support import phoenix

    __all__ = ["phoenix"]  # the fixture, used by name
