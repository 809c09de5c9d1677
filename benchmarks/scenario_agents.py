"""Agent frameworks: what tracing adds to an agent run, per LLM call and per tool call.

For each framework, agent runs driven by the framework's own test doubles (no network): the
OpenAI Agents SDK with a custom ``Model`` (which opens the SDK's generation span as the SDK's
OpenAI models do), LangGraph's ``create_react_agent`` on langchain-core's fake chat model,
pydantic-ai's ``FunctionModel``; each run is ``--steps`` turns, each turn an LLM call that asks
for tool calls, then a final LLM call that answers. Two shapes: one tool call a turn
(``steps + 1`` LLM calls, ``steps`` tool calls) and two a turn (the same LLM calls, ``2 *
steps`` tool calls). LiteLLM has no agent loop: ``--steps`` ``acompletion`` calls on its
``mock_response``. Three variants, each in a fresh process, in an order that turns round by
round:

- ``untraced``: no tracing at all (the Agents SDK's own tracing disabled);
- ``looptrace``: the integration, exporting to a real OTLP server on 127.0.0.1 (in a process
  of its own, answering at once and decoding later);
- ``peer``: the framework's best-known tracing pointed at a local mock: the Agents SDK's own
  exporter to OpenAI (its default processor, endpoint moved to a sink on 127.0.0.1);
  LangSmith's tracer (``LANGSMITH_TRACING=true``, ``LANGSMITH_ENDPOINT`` at the sink);
  pydantic-ai's own instrumentation on the OpenTelemetry SDK (batch processor, OTLP/HTTP
  exporter to the OTLP server); LiteLLM's ``otel`` callback (the same).

A process makes one warm-up run, then ``--runs`` timed runs; its figures are the medians of
their wall time and of the process's CPU time (every thread) over each run and the 50 ms
pause after it, in which a tracer's background thread exports what the run recorded. Per
round, what a variant adds to the untraced run of the same shape gives, per call: a tool
call, what the second tool call of each turn adds (two-a-turn minus one-a-turn, over
``steps``); an LLM call, the rest of what the one-a-turn shape adds, over its LLM calls (the
agent's own steps around a call, its turn or graph node, are in it); a step, what the
one-a-turn shape adds over all its calls. The tables give the median over rounds and the
range. CPU time is the steadier figure on a machine shared with other work; wall time is what
the caller waits.

``--instructions`` counts instead, under ``valgrind --tool=callgrind``, the instructions of one
warm run (10 turns by default, one tool call a turn) and the flush after it, every thread of
the process, for four variants: untraced, ``floor`` (the framework's tracing hooks with a
handler or processor that does nothing: a LangChain callback handler run inline, an Agents SDK
processor, pydantic-ai's instrumentation on the OpenTelemetry API's no-op provider, a LiteLLM
``CustomLogger``; the least any tracer plugged in there can add), looptrace and the peer. What
a step adds is the difference to the untraced run over its LLM and tool calls: a figure the
machine's load does not move. Under callgrind a program runs some forty times slower, so a
tracer's timers would fire forty times as often per span as at full speed: the counted runs
set them past the run (looptrace's flush interval and in-progress snapshots, the batch
processors' schedules), so each tracer sends once, at the flush after the run, as it does at
full speed for a run this short; looptrace's wall-clock slices of encoding (0.5 ms) and its
spool's idle checks (2 s) are stretched by the slowdown (``SLOWDOWN``), so they come as often
per span as at full speed. What no setting reaches (the Agents SDK's batch thread waking every
0.2 s) still happens more often: the tracers' figures are upper bounds, the floor and the
untraced run exact. LiteLLM is left out by default: its own timed work
dominates its run under callgrind (its counts moved by tens of millions between variants).

``--encoder`` counts looptrace's encoder alone (size estimate, planning walk, encoding) over the
spans of one run captured in memory, per span, under callgrind with the garbage collector off:
the flusher's share of an integration's cost, which the run's other work does not move.

    python benchmarks/scenario_agents.py [--steps 50] [--rounds 3] [--runs 5] [--frameworks ...]
    python benchmarks/scenario_agents.py --instructions [--steps 10] [--frameworks ...]
    python benchmarks/scenario_agents.py --encoder [--steps 10] [--frameworks ...]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TESTS = Path(__file__).resolve().parent.parent / "tests"
PEER = {
    "openai-agents": "SDK exporter",
    "langchain": "LangSmith",
    "pydantic-ai": "OTel SDK",
    "litellm": "otel callback",
}


# --- the agent runs ---------------------------------------------------------------------


def openai_agents_run(variant: str, steps: int, tools: int, otlp: str, sink: str) -> Any:
    import agents
    from agents import Agent, ModelResponse, Runner, Usage, function_tool
    from agents.models.interface import Model
    from agents.tracing import generation_span
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    if variant == "untraced":
        agents.set_tracing_disabled(True)
    elif variant == "floor":
        from agents.tracing import TracingProcessor

        class Nothing(TracingProcessor):
            def on_trace_start(self, trace: Any) -> None: ...
            def on_trace_end(self, trace: Any) -> None: ...
            def on_span_start(self, span: Any) -> None: ...
            def on_span_end(self, span: Any) -> None: ...
            def shutdown(self) -> None: ...
            def force_flush(self) -> None: ...

        agents.set_trace_processors([Nothing()])
    elif variant == "looptrace":
        from looptrace.integrations.openai_agents import instrument_openai_agents

        instrument_openai_agents(keep_openai_export=False)
    else:
        from agents.tracing.processors import default_exporter

        agents.set_tracing_export_api_key("sk-bench")
        default_exporter().endpoint = sink
        if os.environ.get("BENCH_COUNT"):
            from agents.tracing.processors import BatchTraceProcessor

            # Sends at the flush after the run only, as at full speed (see COUNT_TIMERS).
            agents.set_trace_processors(
                [BatchTraceProcessor(default_exporter(), schedule_delay=COUNT_TIMERS)]
            )

    class Scripted(Model):
        """Calls the tool ``tools`` times a turn until it has had ``steps`` turns, then
        answers."""

        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            seen = sum(
                1 for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"
            )
            output: list[Any]
            if seen < steps * tools:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=f"c{seen + j}",
                        name="get_weather",
                        arguments='{"city": "Paris"}',
                    )
                    for j in range(tools)
                ]
            else:
                text = ResponseOutputText(type="output_text", text="sunny", annotations=[])
                output = [
                    ResponseOutputMessage(
                        id="m", type="message", role="assistant", status="completed", content=[text]
                    )
                ]
            with generation_span(model="gpt-4o-mini", input=input[-1:]) as span:
                span.span_data.output = [o.model_dump() for o in output]
                span.span_data.usage = {"input_tokens": 12, "output_tokens": 5}
            usage = Usage(requests=1, input_tokens=12, output_tokens=5, total_tokens=17)
            return ModelResponse(output=output, usage=usage, response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    agent = Agent(name="forecaster", tools=[get_weather], model=Scripted())

    async def run() -> None:
        result = await Runner.run(agent, "Weather in Paris?", max_turns=steps + 5)
        assert result.final_output == "sunny"

    return run


def langchain_run(variant: str, steps: int, tools: int, otlp: str, sink: str) -> Any:
    if variant == "peer":
        os.environ.update(
            LANGSMITH_TRACING="true", LANGSMITH_ENDPOINT=sink, LANGSMITH_API_KEY="lsv2-bench"
        )
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    if variant == "looptrace":
        from looptrace.integrations.langchain import instrument_langchain

        instrument_langchain()
    elif variant == "floor":
        from langchain_core.callbacks import BaseCallbackHandler
        from langchain_core.tracers.context import register_configure_hook

        class Nothing(BaseCallbackHandler):
            run_inline = True  # as looptrace's handler: called on the caller's thread

        register_configure_hook(_Fixed(Nothing()), True)  # type: ignore[arg-type]

    usage = {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}

    class ChatModel(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def replies() -> Any:
        for i in range(steps):
            calls = [
                {"name": "get_weather", "args": {"city": "Paris"}, "id": f"c{i}.{j}"}
                for j in range(tools)
            ]
            yield AIMessage(content="", tool_calls=calls, usage_metadata=usage)  # type: ignore[arg-type]
        yield AIMessage(content="sunny", usage_metadata=usage)  # type: ignore[arg-type]

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def run() -> None:
        agent = create_react_agent(ChatModel(messages=replies()), [get_weather])
        state = await agent.ainvoke(
            {"messages": [("human", "Weather in Paris?")]},
            config={"recursion_limit": 2 * steps + 10},
        )
        assert state["messages"][-1].content == "sunny"

    return run


def otel_sdk(otlp: str) -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp)))
    trace.set_tracer_provider(provider)


def pydantic_ai_run(variant: str, steps: int, tools: int, otlp: str, sink: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    if variant == "looptrace":
        from looptrace.integrations.pydantic_ai import instrument_pydantic_ai

        assert instrument_pydantic_ai()
    elif variant == "peer":
        otel_sdk(otlp)
        Agent.instrument_all()
    elif variant == "floor":
        Agent.instrument_all()  # on the OpenTelemetry API's no-op provider: nothing recorded

    def respond(messages: Any, info: Any) -> ModelResponse:
        seen = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        if seen < steps * tools:
            calls = [
                ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id=f"c{seen + j}")
                for j in range(tools)
            ]
            return ModelResponse(parts=calls)  # type: ignore[arg-type]
        return ModelResponse(parts=[TextPart("sunny")])

    agent: Agent[None, str] = Agent(FunctionModel(respond), name="forecaster")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def run() -> None:
        from pydantic_ai.usage import UsageLimits

        limits = UsageLimits(request_limit=steps + 5)
        result = await agent.run("Weather in Paris?", usage_limits=limits)
        assert result.output == "sunny"

    return run


def litellm_run(variant: str, steps: int, tools: int, otlp: str, sink: str) -> Any:
    if variant == "peer":
        os.environ.update(OTEL_EXPORTER="otlp_http", OTEL_ENDPOINT=otlp)
    import litellm

    if variant == "looptrace":
        from looptrace.integrations.litellm import instrument_litellm

        instrument_litellm()
    elif variant == "peer":
        litellm.callbacks = ["otel"]
    elif variant == "floor":
        from litellm.integrations.custom_logger import CustomLogger

        litellm.callbacks = [CustomLogger()]

    messages = [{"role": "user", "content": "Weather in Paris?"}]

    async def run() -> None:
        for _ in range(steps):
            response = await litellm.acompletion(
                model="gpt-4o-mini", messages=messages, mock_response="sunny"
            )
            assert response.choices[0].message.content == "sunny"

    return run


RUNS = {
    "openai-agents": openai_agents_run,
    "langchain": langchain_run,
    "pydantic-ai": pydantic_ai_run,
    "litellm": litellm_run,
}


def worker(
    framework: str, variant: str, steps: int, tools: int, runs: int, otlp: str, sink: str
) -> None:
    if variant == "looptrace":
        import looptrace

        looptrace.configure(endpoint=otlp, service_name="bench")
        from looptrace.integrations import _common

        _common.load_prices()  # at start-up, as instrument_*() at import does
        if os.environ.get("BENCH_COUNT"):
            # Timed by the wall clock, so under callgrind they would come SLOWDOWN times as
            # often per span as at full speed (see SLOWDOWN): the flusher's slices of the loop
            # and the spool's checks for files while it finds none.
            from looptrace._export import exporter, replay

            exporter.SLICE_SECONDS *= SLOWDOWN
            replay.IDLE_SECONDS *= SLOWDOWN
    run = RUNS[framework](variant, steps, tools, otlp, sink)

    def flush() -> None:
        """What the tracer holds is sent before the process ends (not timed), so the driver
        can check that each variant traced."""
        if variant == "looptrace":
            import looptrace

            assert looptrace.flush_sync(10).ok
        elif variant == "peer" and framework == "openai-agents":
            import agents

            agents.flush_traces()
        elif variant == "peer" and framework == "langchain":
            from langchain_core.tracers.langchain import wait_for_all_tracers

            wait_for_all_tracers()
        elif variant == "peer":
            from opentelemetry import trace

            trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]

    if os.environ.get("BENCH_COUNT"):
        # Under callgrind: one warm run counted alone, with what the tracer's threads do for
        # it (the flush after it is inside the count). getppid() zeroes the counters and
        # getpgrp() dumps them (--zero-before / --dump-before).
        async def flushed() -> None:
            if variant == "looptrace":
                import looptrace

                # On the loop, as an application flushes (a program under callgrind runs some
                # forty times slower: a generous deadline).
                assert (await looptrace.flush(timeout=300)).ok
            else:
                flush()

        async def counted() -> None:
            await run()
            await asyncio.sleep(0.05)
            await flushed()
            os.getppid()
            await run()
            await flushed()
            os.getpgrp()

        asyncio.run(counted())
        os._exit(0)

    async def main() -> tuple[list[float], list[float]]:
        await run()  # warm-up: imports, caches, the first span's set-up
        await asyncio.sleep(0.05)
        walls, cpus = [], []
        for _ in range(runs):
            c0 = time.process_time()
            t0 = time.perf_counter()
            await run()
            walls.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)  # a batch exporter's thread gets to send between runs
            # The process's CPU (every thread) over the run and the pause after it: a
            # tracer's background work for this run counts, other processes' load does not.
            cpus.append(time.process_time() - c0)
        return walls, cpus

    walls, cpus = asyncio.run(main())
    flush()
    print(json.dumps([statistics.median(walls), statistics.median(cpus)]))
    sys.stdout.flush()
    os._exit(0)  # a peer's exit flush to a sink is not the run's cost


# --- a sink that answers 200 to anything (LangSmith, the Agents SDK's exporter) -----------


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    received = 0

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        Sink.received += 1
        body = json.dumps({"received": Sink.received}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_sink() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.handle_error = lambda *a: None  # type: ignore[method-assign]  # a client gone at exit
    print(server.server_address[1], flush=True)
    server.serve_forever()


# --- the driver ----------------------------------------------------------------------------


def measure(
    framework: str, variant: str, tools: int, args: argparse.Namespace, otlp: str, sink: str
) -> tuple[float, float]:
    out = subprocess.run(
        [
            *(sys.executable, __file__, "--worker", framework, variant),
            *("--steps", str(args.steps), "--tools", str(tools), "--runs", str(args.runs)),
            *("--otlp", otlp, "--sink", sink),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{framework} {variant}: {out.stderr[-2000:]}")
    wall, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return float(wall), float(cpu)


VARIANTS = ("untraced", "looptrace", "peer")
NAMES = {
    "openai-agents": "OpenAI Agents SDK",
    "langchain": "LangChain / LangGraph",
    "pydantic-ai": "pydantic-ai",
    "litellm": "LiteLLM",
}


def per_call(
    times: dict[tuple[str, int], list[float]], variant: str, steps: int, agent: bool
) -> dict[str, tuple[float, float, float]]:
    """What ``variant`` adds to the untraced run, per LLM call, per tool call and per step
    (LLM and tool calls together), in microseconds: median over rounds, and the range.

    An agent run of ``steps`` turns with one tool call a turn makes ``steps + 1`` LLM calls
    and ``steps`` tool calls; with two a turn, ``2 * steps`` tool calls and the same LLM
    calls. What the second tool call of each turn adds is the cost of a tool call; the rest
    of what the first shape adds, over its LLM calls, is the cost of an LLM call (with the
    agent's own steps around it: its turn, its graph node)."""
    rows: dict[str, list[float]] = {"llm": [], "tool": [], "step": []}
    rounds = len(times[(variant, 1)])
    for r in range(rounds):
        one = times[(variant, 1)][r] - times[("untraced", 1)][r]
        if agent:
            two = times[(variant, 2)][r] - times[("untraced", 2)][r]
            tool = (two - one) / steps
            llm = (one - steps * tool) / (steps + 1)
            rows["tool"].append(tool * 1e6)
            rows["llm"].append(llm * 1e6)
            rows["step"].append(one / (2 * steps + 1) * 1e6)
        else:
            rows["llm"].append(one / steps * 1e6)
            rows["step"].append(one / steps * 1e6)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in rows.items() if v}


def cell(figure: tuple[float, float, float] | None) -> str:
    if figure is None:
        return "-"
    return f"{figure[0]:.0f} us ({figure[1]:.0f} .. {figure[2]:.0f})"


def langchain_handler_cost(steps: int, replays: int) -> None:
    """The LangChain handler's own cost, apart from the run: the callbacks of one LangGraph
    agent run (``steps`` turns, one tool call a turn) are recorded, then replayed into
    looptrace's handler (spans kept in memory) ``replays`` times; the process CPU time of the
    callbacks, and of serializing the spans they made as the exporter does, per step (LLM or
    tool call), median over replays. Both are CPU time of this process only, so they are
    steady where the end-to-end figures are not."""
    import uuid

    from langchain_core.callbacks import BaseCallbackHandler

    from looptrace._config import Config
    from looptrace._serialize.spans import to_wire
    from looptrace.integrations.langchain import Handler
    from looptrace.testing import capture_spans

    events: list[tuple[str, Any, dict[str, Any]]] = []

    class Recorder(BaseCallbackHandler):
        run_inline = True

    for name in (
        "on_chain_start",
        "on_chain_end",
        "on_chat_model_start",
        "on_llm_end",
        "on_tool_start",
        "on_tool_end",
    ):

        def record(self: Any, *a: Any, _name: str = name, **k: Any) -> None:
            events.append((_name, a, k))

        setattr(Recorder, name, record)

    run = langchain_run("untraced", steps, 1, "", "")

    async def recorded() -> None:
        from langchain_core.tracers.context import register_configure_hook

        register_configure_hook(_Fixed(Recorder()), True)  # type: ignore[arg-type]
        await run()

    asyncio.run(recorded())
    calls = 2 * steps + 1
    cfg = Config()
    on_loop: list[float] = []
    export: list[float] = []
    with capture_spans() as spans:
        handler = Handler()
        for _ in range(replays):
            ids: dict[Any, Any] = {}
            replay = []
            for name, a, k in events:
                k = dict(k)
                for key in ("run_id", "parent_run_id"):
                    if k.get(key) is not None:
                        k[key] = ids.setdefault(k[key], uuid.uuid4())
                replay.append((getattr(handler, name), a, k))
            c0 = time.process_time()
            for fn, a, k in replay:
                fn(*a, **k)
            on_loop.append((time.process_time() - c0) / calls * 1e6)
            c0 = time.process_time()
            for span in spans:
                to_wire(span, cfg)
            export.append((time.process_time() - c0) / calls * 1e6)
            spans.clear()
    print(
        f"LangChain handler, {len(events)} callbacks of a {steps}-turn LangGraph agent run "
        f"replayed {replays} times: on the caller's path {statistics.median(on_loop):.1f} us "
        f"per step (LLM or tool call), serialized by the exporter "
        f"{statistics.median(export):.1f} us per step (process CPU time, medians)"
    )


class _Fixed:
    """What langchain_core's configure hook reads (``.get()``): one handler for every run."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def get(self) -> Any:
        return self.handler


# Under callgrind a run takes some forty times as long, so a tracer's timers (looptrace's flush
# interval and in-progress snapshots, a batch processor's schedule) would fire forty times as
# often per span as at full speed, where a 10-turn run (tens of milliseconds) ends before any
# of them. The counted runs set them all past the run (seconds): every tracer sends what the run
# recorded once, at the flush after it, as it would at full speed. What no setting reaches
# still fires more often (the Agents SDK's batch thread wakes every 0.2 s, LangSmith's thread
# sends as it goes).
COUNT_TIMERS = 1000.0
# How much longer a run takes under callgrind here: a warm 10-turn Agents SDK run, untraced,
# 60.7 ms at full speed and 2.59 s under callgrind (43x). looptrace's wall-clock slices (the
# flusher encodes for 0.5 ms, then lets the loop turn) and its spool's idle checks (every 2 s)
# are stretched by this much in the counted runs, so that they come as often per span as at
# full speed; a little less than the measured factor, so they still come a little more often.
SLOWDOWN = 40.0


def counted(name: str, args: list[str], env: dict[str, str], tmp: str) -> tuple[int, str]:
    """Instructions this script counts between its ``os.getppid()`` and ``os.getpgrp()``
    markers when run with ``args`` under callgrind (every thread), and what it printed."""
    done = subprocess.run(
        [
            *("valgrind", "--tool=callgrind", f"--callgrind-out-file={os.path.join(tmp, name)}"),
            *("--zero-before=os_getppid", "--dump-before=os_getpgrp"),
            *(sys.executable, __file__, *args),
        ],
        env={**os.environ, "PYTHONHASHSEED": "0", **env},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    dumps = [f for f in os.listdir(tmp) if f.startswith(f"{name}.")]
    if done.returncode != 0 or len(dumps) != 1:
        said = [line for line in done.stderr.splitlines() if not line.startswith("==")]
        raise RuntimeError(f"{name}: exit {done.returncode}, dumps {dumps}: {said[-20:]}")
    text = Path(tmp, dumps[0]).read_text()
    return int(text.split("\nsummary: ", 1)[1].split()[0]), done.stdout


def count(framework: str, variant: str, steps: int, otlp: str, sink: str, tmp: str) -> int:
    """Instructions of one warm agent run and the flush after it, every thread of the
    process, under callgrind."""
    env = {
        "BENCH_COUNT": "1",
        # Each tracer sends at the flush after the run only (see COUNT_TIMERS).
        "LOOPTRACE_FLUSH_INTERVAL": str(COUNT_TIMERS),
        "LOOPTRACE_IN_PROGRESS_AFTER": str(COUNT_TIMERS),
        "OTEL_BSP_SCHEDULE_DELAY": str(int(COUNT_TIMERS * 1000)),
    }
    args = ["--worker", framework, variant, "--steps", str(steps), "--tools", "1"]
    args += ["--runs", "1", "--otlp", otlp, "--sink", sink]
    return counted(f"cg-{framework}-{variant}", args, env, tmp)[0]


def instructions(frameworks: list[str], steps: int, otlp: str, sink: str) -> None:
    """Per framework, the instructions a step (an LLM or a tool call) adds to the untraced
    run: for the framework's tracing hooks alone, doing nothing (``floor``: a handler or
    processor with no body, the least any tracer plugged in there can cost), for looptrace,
    and for the peer. A figure the machine's load does not move."""
    import tempfile

    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind")
        return
    print(
        f"instructions a step adds to the untraced run (one warm run of {steps} turns, one "
        "tool call a turn, and the flush after it; every thread)"
    )
    print(
        "| framework | untraced run | hooks alone (floor) | looptrace | looptrace over floor | peer |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for framework in frameworks:
            calls = steps if framework == "litellm" else 2 * steps + 1
            got = {v: count(framework, v, steps, otlp, sink, tmp) for v in COUNTED}
            base = got["untraced"]
            added = {v: (got[v] - base) / calls for v in COUNTED}
            print(
                f"| {NAMES[framework]} | {base / calls:,.0f} | {added['floor']:,.0f} "
                f"| {added['looptrace']:,.0f} | {added['looptrace'] - added['floor']:,.0f} "
                f"| {added['peer']:,.0f} ({PEER[framework]}) |",
                flush=True,
            )


def encoder_worker(framework: str, steps: int) -> None:
    """Under callgrind: the spans of one traced run, captured in memory, then looptrace's
    encoder over them (the size estimate, the planning walk, the encoding), counted alone with
    the garbage collector off. What the flusher spends per span on the spans an integration
    makes, whatever the rest of the run does."""
    import gc

    from looptrace import _export, _serialize
    from looptrace._otlp.span_encoder import SpanEncoder
    from looptrace.integrations import _common
    from looptrace.testing import capture_spans

    _common.load_prices()
    run = RUNS[framework]("looptrace", steps, 1, "", "")
    with capture_spans() as spans:
        asyncio.run(run())
    encoder = SpanEncoder(_export.get_config())

    def encode_all() -> None:
        for span in spans:
            _serialize.estimate_size(span)
            encoder.encode(span, encoder.plan(span))

    encode_all()  # warm: caches, the prices worked out
    gc.disable()
    os.getppid()
    encode_all()
    os.getpgrp()
    print(len(spans))
    sys.stdout.flush()
    os._exit(0)


def encoder_instructions(frameworks: list[str], steps: int) -> None:
    """Per framework, the encoder's instructions per span of one run (see encoder_worker).
    Run it with an older ``src`` first on PYTHONPATH to compare commits."""
    import tempfile

    if shutil.which("valgrind") is None:
        print("--encoder needs valgrind")
        return
    print(f"looptrace's encoder over the spans of one {steps}-turn run, under callgrind")
    print("| framework | spans | instructions | per span |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for framework in frameworks:
            args = ["--encoder-worker", framework, "--steps", str(steps)]
            total, printed = counted(f"enc-{framework}", args, {}, tmp)
            spans = int(printed.split()[-1])
            print(
                f"| {NAMES[framework]} | {spans} | {total:,} | {total / spans:,.0f} |", flush=True
            )


COUNTED = ("untraced", "floor", "looptrace", "peer")
INSTRUCTIONS_DEFAULT = "openai-agents,langchain,pydantic-ai"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tools", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--frameworks", default=",".join(RUNS))
    parser.add_argument("--worker", nargs=2)
    parser.add_argument("--otlp", default="")
    parser.add_argument("--sink", default="")
    parser.add_argument("--serve-sink", action="store_true")
    parser.add_argument(
        "--encoder",
        action="store_true",
        help="looptrace's encoder alone: instructions per span of one run (10 turns)",
    )
    parser.add_argument("--encoder-worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--handler-cost",
        action="store_true",
        help="only the LangChain handler's own CPU per step, on replayed callbacks",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="instructions a step adds, under callgrind (default 10 turns a run)",
    )
    args = parser.parse_args()
    if args.serve_sink:
        serve_sink()
        return
    if args.encoder_worker:
        encoder_worker(args.encoder_worker, args.steps)
        return
    if args.encoder:
        steps = args.steps if "--steps" in sys.argv else 10
        chosen = args.frameworks if "--frameworks" in sys.argv else INSTRUCTIONS_DEFAULT
        encoder_instructions(chosen.split(","), steps)
        return
    if args.handler_cost:
        langchain_handler_cost(args.steps, 20)
        return
    if args.worker:
        worker(*args.worker, args.steps, args.tools, args.runs, args.otlp, args.sink)
        return

    sys.path.insert(0, str(TESTS))
    from otlp_server import OtlpServerProcess

    sink_proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-sink"], stdout=subprocess.PIPE, text=True
    )
    assert sink_proc.stdout is not None
    sink = f"http://127.0.0.1:{int(sink_proc.stdout.readline())}"
    results = []
    try:
        with OtlpServerProcess(defer_decode=True) as server:
            if args.instructions:
                steps = args.steps if "--steps" in sys.argv else 10
                # LiteLLM's own work on timers (its logging worker) dominates its run under
                # callgrind's slowdown: its counts moved by tens of millions between variants.
                chosen = args.frameworks if "--frameworks" in sys.argv else INSTRUCTIONS_DEFAULT
                instructions(chosen.split(","), steps, server.endpoint, sink)
                return
            for framework in args.frameworks.split(","):
                shapes = (1,) if framework == "litellm" else (1, 2)
                jobs = [(v, k) for k in shapes for v in VARIANTS]
                walls: dict[tuple[str, int], list[float]] = {j: [] for j in jobs}
                cpus: dict[tuple[str, int], list[float]] = {j: [] for j in jobs}
                for r in range(args.rounds):
                    # Each round in another order, so a slow spell of the machine does not
                    # always fall on the same variant.
                    order = jobs[r % len(jobs) :] + jobs[: r % len(jobs)]
                    for variant, tools in order if r % 2 == 0 else order[::-1]:
                        wall, cpu = measure(framework, variant, tools, args, server.endpoint, sink)
                        walls[(variant, tools)].append(wall)
                        cpus[(variant, tools)].append(cpu)
                results.append((framework, walls, cpus))
                print(f"  {framework} done", file=sys.stderr)
    finally:
        sink_proc.terminate()
        sink_proc.wait(10)

    print(
        f"{args.steps} turns per agent run, one tool call a turn ({args.steps + 1} LLM calls, "
        f"{args.steps} tool calls) and two a turn; LiteLLM: {args.steps} acompletion calls. "
        f"{args.rounds} rounds x {args.runs} runs, a fresh process per variant. Added to the "
        "untraced run, per call: median over rounds (range)."
    )
    for label, which in (("wall time of the run", 1), ("process CPU time", 2)):
        print(f"\n{label}")
        print("| framework | untraced run | tracer | per LLM call | per tool call | per step |")
        print("|---|---|---|---|---|---|")
        for framework, walls, cpus in results:
            times = walls if which == 1 else cpus
            agent = framework != "litellm"
            base = statistics.median(times[("untraced", 1)]) * 1e3
            for variant in ("looptrace", "peer"):
                f = per_call(times, variant, args.steps, agent)
                tracer = "looptrace" if variant == "looptrace" else PEER[framework]
                print(
                    f"| {NAMES[framework]} | {base:.1f} ms | {tracer} | {cell(f.get('llm'))} "
                    f"| {cell(f.get('tool'))} | {cell(f.get('step'))} |"
                )


if __name__ == "__main__":
    main()
