"""A long agent run in one trace, as OTLP Exports: an ``invoke_agent`` root and, one after the
other, ``calls`` steps of an LLM call (the agent's CLIENT span over the model server's SERVER span
and its queue, prefill and decode phases, 64 token offsets on decode) followed by a tool call
(``execute_tool``): 6 spans a step, 3,300 steps make 19,801 spans.

``wide_run(trace_id, calls)`` gives the Exports (at most ``per_export`` spans each) and the
trace's span count; every span is at ``T0`` plus a few ms per step, so ``latscope serve`` takes
them only with its span time window off (``--max-span-age-s 0``). ``with_prompts(exports, kb)``
serializes them with a prompt and a completion of ``kb`` kB on every span, ``prompt_exports(kb)``
spans an Export (``bench.api.traces`` and ``bench.attribution.wide``, ``--prompt-kb``).
"""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

T0 = 1_763_000_000_000_000_000
MS = 1_000_000
#: Spans of one step (client, server, three phases, the tool) and of the run (plus the root).
SPANS_PER_CALL = 6
#: One step: the call, then the tool, each this long (ms), with 1 ms of the agent's own between.
CALL_MS, TOOL_MS, GAP_MS = 40, 10, 1
STEP_MS = CALL_MS + TOOL_MS + 2 * GAP_MS


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _span(
    trace_id: bytes, span_id: bytes, parent: bytes, name: str, kind: int, start: int, end: int,
    **attributes: object,
) -> Span:  # fmt: skip
    return Span(
        trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
        start_time_unix_nano=start, end_time_unix_nano=end,
        attributes=[_kv(k.replace("__", "."), v) for k, v in attributes.items()],
    )  # fmt: skip


def span_count(calls: int) -> int:
    return 1 + SPANS_PER_CALL * calls


def wide_run(
    trace_id: bytes, calls: int, *, per_export: int = 2_000, seed: int = 0
) -> list[ExportTraceServiceRequest]:
    """The run's spans as Exports of at most ``per_export`` spans (agent's and model server's
    spans under their own resources), root first."""
    rng = random.Random(seed)
    agent: list[Span] = []
    model: list[Span] = []
    root_id = rng.randbytes(8)
    end = T0 + calls * STEP_MS * MS + GAP_MS * MS
    agent.append(
        _span(trace_id, root_id, b"", "invoke_agent planner", 1, T0, end,
              gen_ai__operation__name="invoke_agent", gen_ai__agent__name="planner")
    )  # fmt: skip
    offsets = "[" + ",".join(str(1000 + 400 * i) for i in range(64)) + "]"
    for step in range(calls):
        t = T0 + (step * STEP_MS + GAP_MS) * MS
        client, server = rng.randbytes(8), rng.randbytes(8)
        agent.append(
            _span(trace_id, client, root_id, "chat llama-3-8b", 3, t, t + CALL_MS * MS,
                  gen_ai__operation__name="chat", gen_ai__request__model="llama-3-8b",
                  gen_ai__usage__input_tokens=rng.randint(500, 4000),
                  gen_ai__usage__output_tokens=64)
        )  # fmt: skip
        s = t + 2 * MS
        phases = (("queue", s + MS, s + 5 * MS), ("prefill", s + 5 * MS, s + 12 * MS),
                  ("decode", s + 12 * MS, s + 35 * MS))  # fmt: skip
        model.append(
            _span(trace_id, server, client, "POST /v1/chat/completions", 2, s, s + 36 * MS,
                  gen_ai__request__model="llama-3-8b", http__route="/v1/chat/completions")
        )  # fmt: skip
        for phase, a, b in phases:
            attributes: dict[str, object] = {"latscope__phase": phase}
            if phase == "decode":
                attributes["latscope__token_offsets_us"] = offsets
            model.append(_span(trace_id, rng.randbytes(8), server, phase, 1, a, b, **attributes))
        tool_start = t + (CALL_MS + GAP_MS) * MS
        agent.append(
            _span(trace_id, rng.randbytes(8), root_id, "execute_tool search", 1, tool_start,
                  tool_start + TOOL_MS * MS, gen_ai__operation__name="execute_tool",
                  gen_ai__tool__name="search")
        )  # fmt: skip
    exports = []
    for service, spans in (("agent", agent), ("llm-server", model)):
        for i in range(0, len(spans), per_export):
            req = ExportTraceServiceRequest()
            rs: ResourceSpans = req.resource_spans.add()
            rs.resource.attributes.append(_kv("service.name", service))
            rs.scope_spans.add().spans.extend(spans[i : i + per_export])
            exports.append(req)
    return exports


def prompt_exports(kb: int) -> int:
    """Spans an Export carries when each carries a prompt and a completion of ``kb`` kB: about 8
    MB an Export (``wide_run``'s default of 2,000 without them)."""
    return 2_000 if not kb else max(1, (8 << 20) // (2 * 1024 * kb))


def with_prompts(messages: list[ExportTraceServiceRequest], kb: int) -> list[bytes]:
    """The Exports serialized, each span carrying a prompt and a completion of ``kb`` kB each
    (random hex: incompressible, as text nearly is for the engine's codec), none when ``kb`` is
    0."""
    rng = random.Random(1)
    for message in messages if kb else ():
        for rs in message.resource_spans:
            for span in rs.scope_spans[0].spans:
                for key in ("gen_ai.prompt", "gen_ai.completion"):
                    text = rng.randbytes(kb * 512).hex()
                    span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=text)))
    return [m.SerializeToString() for m in messages]
