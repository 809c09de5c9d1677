"""The local store: spans in one SQLite file (WAL mode), written by the client and the collector.

With no endpoint configured, the store's exporter (``looptrace._export.store``) writes the
client's spans here; ``looptrace serve``
writes the spans it receives over OTLP/HTTP into the same file. Both go through
``Store.write``, which applies one batch in one ``BEGIN IMMEDIATE`` transaction with
``synchronous=FULL``: once it returns, the batch survives a crash of the process *and* of the
machine, which is what the collector promises when it answers 200.

Tables (``SCHEMA_VERSION`` in ``meta``; ``schema._MIGRATIONS`` moves older files forward):

    spans        one row per span; a final record replaces an in-progress one, never the reverse
    traces       one summary row per trace, kept up to date on write (listing is an index scan)
    resources    resource attribute sets, stored once and referenced by spans
    experiments  one row per experiment seen in span attributes
    scores       one row per (span, score name) from ``looptrace.score.*`` attributes

Retention (``max_age_days``, ``max_bytes``) deletes whole traces, oldest first, at most once a
minute or when a lot has been written since the last check; never on every write.

The parts, one job each: ``schema`` (tables, migrations, ``StoreError``), ``connection`` (the
file, the writer and reader connections), ``write`` (``Store.write`` and ``_prepare``),
``retention``, ``traces``, ``experiments`` and ``lag`` (the reads), ``columns`` (the JSON
columns) and ``store`` (``Store``, all of them in one class).
"""

from __future__ import annotations

from .lag import LAG_PREFIX
from .schema import SCHEMA_VERSION, StoreError, conn_path
from .store import Store
from .traces import LAG_SPAN_NAME, span_from_row

__all__ = [
    "LAG_PREFIX",
    "LAG_SPAN_NAME",
    "SCHEMA_VERSION",
    "Store",
    "StoreError",
    "conn_path",
    "span_from_row",
]
