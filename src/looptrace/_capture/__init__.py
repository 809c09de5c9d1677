"""Capture: what runs on the caller's thread, in a few microseconds per span.

    spans       the Span object and its record (attributes, events, links, status)
    context     the active span (a ContextVar), W3C trace context in and out
    start       starting and activating spans under the active one, sampled by trace id
    decorators  ``@traced`` and ``span()``: one wrapper per kind of function
    generators  spans that stay open across a generator's life

Capture imports nothing of export or the stages after it: an ended span goes to
``_state.sink``, which the export stage installs. The package root imports nothing, so that the
stages that only read spans (the serializer, a worker process) load ``spans`` alone.
"""
