"""The demo's scenarios: one healthy baseline and one per complaint an on-call engineer hears.

A scenario is an engine (how the simulated GPU server costs its work), a load (who calls it and
how), a network (the delay a proxy adds between them) and what latscope should conclude. Costs
are simulated with ``asyncio.sleep`` so a busy machine stretches them only by scheduling jitter,
which the ground truth records rather than assumes away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class EngineConfig:
    """Cost model of the simulated continuous-batching server (milliseconds)."""

    #: Sequences decoded together at most (the running batch).
    max_batch: int = 16
    #: Requests waiting for a batch slot at most; beyond it the server answers 503.
    max_waiting: int = 1024
    #: Prompt tokens one prefill step takes at most (vLLM's max_num_batched_tokens); a longer
    #: prompt still goes alone.
    max_prefill_tokens: int = 16384
    #: KV-cache capacity in tokens (0: unlimited). When the running sequences outgrow it, the
    #: newest is preempted and recomputed later, and its stream stalls meanwhile.
    kv_cache_tokens: int = 0
    #: Tokenization: fixed cost plus a cost per prompt token (preprocess).
    tokenize_ms: float = 0.5
    tokenize_ms_per_1k: float = 0.5
    #: An uninstrumented step (auth, rate limiting): time no phase covers, shown as "other".
    uninstrumented_ms: float = 1.0
    #: One prefill step: fixed cost plus a cost per prompt token of every request admitted.
    prefill_ms: float = 4.0
    prefill_ms_per_1k: float = 10.0
    #: One decode step: fixed cost, a cost per running sequence and per 1k tokens of context.
    decode_ms: float = 6.0
    decode_ms_per_seq: float = 0.15
    decode_ms_per_1k_ctx: float = 0.05
    #: Detokenization and formatting of the finished response (postprocess).
    detokenize_ms: float = 0.5
    detokenize_ms_per_1k: float = 10.0
    #: A new replica runs cold for ``cold_s`` seconds from its first request: each prefill step
    #: then costs ``cold_prefill_ms`` more (kernels compiled and CUDA graphs captured on first
    #: use, weights still paging in).
    cold_s: float = 0.0
    cold_prefill_ms: float = 0.0

    def prefill_cost_ms(self, prompt_tokens: int) -> float:
        """Time of one prefill step over ``prompt_tokens`` tokens (all admitted requests)."""
        return self.prefill_ms + self.prefill_ms_per_1k * prompt_tokens / 1000

    def decode_cost_ms(self, batch: int, context_tokens: int) -> float:
        """Time of one decode step for ``batch`` sequences holding ``context_tokens`` in all."""
        return (
            self.decode_ms
            + self.decode_ms_per_seq * batch
            + self.decode_ms_per_1k_ctx * context_tokens / 1000
        )

    def tokenize_cost_ms(self, prompt_tokens: int) -> float:
        return self.tokenize_ms + self.tokenize_ms_per_1k * prompt_tokens / 1000

    def detokenize_cost_ms(self, output_tokens: int) -> float:
        return self.detokenize_ms + self.detokenize_ms_per_1k * output_tokens / 1000


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: log-normal around ``median``, clipped to [low, high]."""

    median: int
    sigma: float = 0.4
    low: int = 1
    high: int = 32768


@dataclass(frozen=True)
class LoadConfig:
    """Who calls the server: a closed loop of ``concurrency`` users, or Poisson arrivals at
    ``rate`` requests/s (open loop, capped at ``max_in_flight``)."""

    concurrency: int = 4
    rate: float | None = None
    max_in_flight: int = 256
    prompt: Lengths = field(default_factory=lambda: Lengths(200, 0.5, 16, 2000))
    output: Lengths = field(default_factory=lambda: Lengths(40, 0.3, 4, 256))
    #: Share of requests sent with ``stream: false`` (one JSON answer).
    non_stream_share: float = 0.0


@dataclass(frozen=True)
class AgentConfig:
    """Agent runs instead of single calls: each of ``LoadConfig.concurrency`` agents runs, one
    after the other, an ``invoke_agent`` root span holding a plan call, a tool call, a group of
    calls in parallel (``asyncio.gather``), another tool call and a final call, with the app's
    own work (parsing, prompt building) between the steps. Times in ms."""

    #: Output tokens of the plan and final calls.
    plan_tokens: int = 24
    final_tokens: int = 40
    #: Calls in the parallel group (inclusive range), and the output tokens of each: the i-th
    #: branch asks for ``parallel_tokens[i]`` (+-20 %), far enough apart that one clearly
    #: finishes last (the critical path takes that one).
    parallel: tuple[int, int] = (2, 3)
    parallel_tokens: tuple[int, ...] = (8, 28, 64)
    #: Tool calls (a sleep inside an ``execute_tool`` span), as (name, low ms, high ms).
    tools: tuple[tuple[str, float, float], ...] = (
        ("search", 30.0, 90.0),
        ("calculator", 1.0, 6.0),
    )
    #: The app's own time before each step and after the last (uniform, ms).
    gap_ms: tuple[float, float] = (2.0, 15.0)


@dataclass(frozen=True)
class Expectation:
    """What latscope's diagnosis must say for the scenario."""

    #: The bucket with the largest share of the time.
    dominant: str
    #: Verdict ids that must appear in the diagnosis (``/v1/attribution/diagnose``).
    verdicts: tuple[str, ...] = ()
    #: Verdict ids that must not appear.
    absent: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    #: The complaint, as on-call hears it.
    complaint: str
    engine: EngineConfig
    load: LoadConfig
    #: Delay the proxy adds in each direction (ms); 0 means no proxy.
    network_delay_ms: float = 0.0
    expect: Expectation = field(default_factory=lambda: Expectation("decode"))
    model: str = "sim-llama-3-8b"
    #: Replicas of the simulated server at the start, and after the scale-up (0: none), which
    #: comes at ``scale_at`` of the run; the load is spread over the replicas round-robin.
    replicas: int = 1
    scale_to: int = 0
    scale_at: float = 0.4
    #: Agent runs (several calls per trace) instead of single calls.
    agent: AgentConfig | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_engine(self, **changes: Any) -> Scenario:
        return replace(self, engine=replace(self.engine, **changes))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="healthy",
            complaint="nothing: a baseline where generating the answer takes the time",
            engine=EngineConfig(),
            # One call in five asks for one JSON answer instead of a stream.
            load=LoadConfig(concurrency=4, non_stream_share=0.2),
            expect=Expectation("decode", absent=("queue_tail", "decode_stalls")),
        ),
        Scenario(
            name="overload",
            complaint="everything is slow since the launch, even short answers",
            # Arrivals (Poisson, 20/s) beyond what 2 batch slots serve (about 15/s): the queue
            # grows, and the later a request comes the longer it waits for a slot.
            engine=EngineConfig(max_batch=2),
            load=LoadConfig(
                rate=20.0,
                prompt=Lengths(150, 0.5, 16, 1000),
                output=Lengths(12, 0.3, 4, 32),
            ),
            expect=Expectation("queue", verdicts=("queue_tail",)),
        ),
        Scenario(
            name="long-prompts",
            complaint="the first token takes ages for the RAG app, the chat app is fine",
            # Retrieval stuffs thousands of tokens into each prompt; prefill grows with them.
            engine=EngineConfig(max_batch=16, prefill_ms_per_1k=80.0),
            load=LoadConfig(
                concurrency=2,
                prompt=Lengths(4000, 0.6, 300, 12000),
                output=Lengths(6, 0.3, 2, 32),
            ),
            expect=Expectation("prefill", verdicts=("prefill_prompt_length",)),
        ),
        Scenario(
            name="big-batches",
            complaint="the stream stutters: tokens arrive in bursts with long pauses",
            # A large running batch makes every decode step slow; each new prompt's prefill
            # holds all running streams back (no chunked prefill), and the batch outgrows the
            # KV cache as its sequences grow: the newest are preempted and stall until they are
            # recomputed.
            engine=EngineConfig(
                max_batch=64,
                decode_ms=8.0,
                decode_ms_per_seq=0.5,
                prefill_ms=10.0,
                prefill_ms_per_1k=60.0,
                kv_cache_tokens=28_000,
            ),
            load=LoadConfig(
                concurrency=48,
                prompt=Lengths(800, 0.3, 200, 3000),
                output=Lengths(48, 0.3, 16, 128),
            ),
            expect=Expectation("decode", verdicts=("decode_stalls",)),
        ),
        Scenario(
            name="slow-network",
            complaint="latency doubled after the move behind the new gateway",
            # Short answers from an idle server, behind a proxy adding 60 ms each way.
            engine=EngineConfig(),
            load=LoadConfig(
                concurrency=4,
                prompt=Lengths(100, 0.5, 16, 500),
                output=Lengths(6, 0.3, 2, 16),
            ),
            network_delay_ms=60.0,
            expect=Expectation("network", absent=("queue_tail", "prefill_prompt_length")),
        ),
        Scenario(
            name="scale-up",
            complaint="every time the autoscaler adds replicas, latency spikes for a while",
            # One replica serving from before the run, then two more at 35 % of the run; each
            # new one runs cold for 2 s from its first request (every prefill step 400 ms
            # longer), and the load (Poisson, 15/s) goes round-robin to every replica as soon
            # as it answers.
            engine=EngineConfig(cold_s=2.0, cold_prefill_ms=400.0),
            load=LoadConfig(
                rate=15.0,
                prompt=Lengths(200, 0.5, 16, 1000),
                output=Lengths(30, 0.3, 8, 64),
            ),
            replicas=1,
            scale_to=3,
            scale_at=0.35,
            expect=Expectation("decode", verdicts=("cold_start",)),
        ),
        Scenario(
            name="agent",
            complaint="the research agent takes seconds: is it the model, the tools or our code?",
            # Three agents at a time, each run making 4-5 calls (2-3 of them in parallel) with
            # two tool calls between; the server has room for all of them (no queue).
            engine=EngineConfig(),
            load=LoadConfig(concurrency=3, prompt=Lengths(300, 0.4, 32, 2000)),
            agent=AgentConfig(),
            expect=Expectation("decode", absent=("queue_tail",)),
        ),
    )
}


def get(name: str) -> Scenario:
    """The scenario called ``name``; ValueError naming the choices otherwise."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(
            f"unknown scenario {name!r}: choose one of {', '.join(SCENARIOS)}"
        ) from None
