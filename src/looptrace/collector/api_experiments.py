"""The experiment pages' API: one experiment a page of cases at a time, and each scorer's trend
over the last runs of the same experiment (shapes in docs/collector.md).

Every summary (counts, errors apart from scorer errors, score means, the trend, what
regressed) is an SQL aggregate in the store (``_store/experiments.py``): an answer carries the
page of cases shown, never the whole experiment.
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ._internals import DEFAULT_REGRESSION_THRESHOLD, Store
from ._internals import BadRequest as _BadRequest
from .api import (
    JSONResponse,
    _api,
    _api_error,
    _float_param,
    _in_thread,
    _int_param,
)

__all__ = ["CASE_PAGE", "routes"]

# Cases in one answer unless asked otherwise (the page shows this many per page).
CASE_PAGE = 100
_CASE_FILTERS = ("task_error", "scorer_error", "error", "ok")


async def _api_experiment(request: Request) -> Response:
    store: Store = request.app.state.store
    experiment_id = request.path_params["experiment_id"]
    preview = _int_param(request, "preview", 200, 0, 10**8)
    limit = _int_param(request, "limit", CASE_PAGE, 1, 10_000)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    case_filter = request.query_params.get("filter") or None
    if case_filter is not None and case_filter not in _CASE_FILTERS:
        raise _BadRequest(f"filter must be one of {', '.join(_CASE_FILTERS)}")
    experiment = await _in_thread(
        functools.partial(
            store.get_experiment,
            experiment_id,
            preview,
            limit=limit,
            offset=offset,
            case_filter=case_filter,
        )
    )
    if experiment is None:
        return _api_error(404, f"no experiment {experiment_id}")
    return JSONResponse(experiment)


async def _api_trend(request: Request) -> Response:
    store: Store = request.app.state.store
    experiment_id = request.path_params["experiment_id"]
    runs = _int_param(request, "runs", 10, 2, 100)
    threshold = _float_param(request, "threshold")
    if threshold is None:
        threshold = DEFAULT_REGRESSION_THRESHOLD
    trend = await _in_thread(store.experiment_trend, experiment_id, runs, threshold)
    if trend is None:
        return _api_error(404, f"no experiment {experiment_id}")
    return JSONResponse(trend)


def routes() -> list[BaseRoute]:
    """``/api/experiments/{id}`` (a page of cases) and ``/api/experiments/{id}/trend``."""
    return [
        Route("/api/experiments/{experiment_id}", _api(_api_experiment), methods=["GET"]),
        Route("/api/experiments/{experiment_id}/trend", _api(_api_trend), methods=["GET"]),
    ]
