"""The demo's continuous-batching engine: scheduling rules, with simulated GPU time skipped."""

from __future__ import annotations

import asyncio
import random

import pytest

from latscope.demo import scenarios
from latscope.demo.engine import END, Engine, Overloaded, Sequence
from latscope.demo.scenarios import EngineConfig


async def _no_wait(_: float) -> None:
    await asyncio.sleep(0)


class Recorder:
    """Sleep that records each step's cost instead of waiting."""

    def __init__(self) -> None:
        self.costs: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.costs.append(seconds)
        await asyncio.sleep(0)


async def _drain(seq: Sequence) -> list[str]:
    tokens = []
    while (tok := await seq.tokens.get()) is not END:
        tokens.append(tok)
    return tokens


def test_costs_grow_with_tokens_batch_and_context() -> None:
    c = EngineConfig()
    assert c.prefill_cost_ms(4000) > c.prefill_cost_ms(100) > 0
    assert c.decode_cost_ms(32, 1000) > c.decode_cost_ms(1, 1000)
    assert c.decode_cost_ms(8, 100_000) > c.decode_cost_ms(8, 1000)
    assert c.tokenize_cost_ms(5000) > c.tokenize_cost_ms(10)
    assert c.detokenize_cost_ms(500) > c.detokenize_cost_ms(5)


def test_every_sequence_gets_exactly_its_tokens_and_the_batch_stays_bounded() -> None:
    config = EngineConfig(max_batch=3)
    peak = 0

    async def main() -> list[list[str]]:
        nonlocal peak

        async def watch(_: float) -> None:
            nonlocal peak
            peak = max(peak, len(engine.running))
            await asyncio.sleep(0)

        engine = Engine(config, sleep=watch)
        task = asyncio.create_task(engine.run())
        seqs = [engine.submit(Sequence(f"r{i}", 10 + i, 1 + i % 5)) for i in range(10)]
        out = await asyncio.gather(*(_drain(s) for s in seqs))
        engine.stop()
        await task
        return out

    out = asyncio.run(main())
    assert [len(t) for t in out] == [1 + i % 5 for i in range(10)]
    assert 1 <= peak <= 3


def test_admission_is_first_come_first_served() -> None:
    async def main() -> list[str]:
        engine = Engine(EngineConfig(max_batch=1), sleep=_no_wait)
        task = asyncio.create_task(engine.run())
        order: list[str] = []

        async def one(seq: Sequence) -> None:
            await seq.admitted.wait()
            order.append(seq.request_id)
            await _drain(seq)

        seqs = [engine.submit(Sequence(f"r{i}", 5, 3)) for i in range(5)]
        await asyncio.gather(*(one(s) for s in seqs))
        engine.stop()
        await task
        return order

    assert asyncio.run(main()) == [f"r{i}" for i in range(5)]


def test_prefill_holds_the_running_batch_and_costs_what_it_admits() -> None:
    config = EngineConfig(max_batch=4, prefill_ms=0.0, prefill_ms_per_1k=1000.0)
    sleep = Recorder()

    async def main() -> None:
        engine = Engine(config, sleep=sleep)
        task = asyncio.create_task(engine.run())
        a = engine.submit(Sequence("a", 100, 3))
        b = engine.submit(Sequence("b", 2000, 3))
        await asyncio.gather(_drain(a), _drain(b))
        engine.stop()
        await task

    asyncio.run(main())
    # Both are admitted in the first step: one prefill over both prompts (2.1 s at 1 ms/token).
    assert sleep.costs[0] == pytest.approx(2.1)


def test_waiting_queue_is_bounded() -> None:
    async def main() -> None:
        engine = Engine(EngineConfig(max_batch=1, max_waiting=2), sleep=_no_wait)
        engine.submit(Sequence("a", 1, 1))
        engine.submit(Sequence("b", 1, 1))
        with pytest.raises(Overloaded):
            engine.submit(Sequence("c", 1, 1))
        assert engine.rejected == 1

    asyncio.run(main())


def test_kv_cache_pressure_preempts_and_recomputes_without_losing_tokens() -> None:
    config = EngineConfig(max_batch=8, kv_cache_tokens=500, max_prefill_tokens=10_000)

    async def main() -> tuple[list[int], int, int]:
        engine = Engine(config, sleep=_no_wait)
        task = asyncio.create_task(engine.run())
        seqs = [engine.submit(Sequence(f"r{i}", 100, 60)) for i in range(5)]
        out = await asyncio.gather(*(_drain(s) for s in seqs))
        engine.stop()
        await task
        return [len(t) for t in out], engine.preemptions, sum(s.preempted for s in seqs)

    lengths, preemptions, per_seq = asyncio.run(main())
    assert lengths == [60] * 5
    assert preemptions > 0
    assert per_seq == preemptions


def test_cancelled_sequences_leave_the_batch() -> None:
    async def main() -> int:
        engine = Engine(EngineConfig(max_batch=2), sleep=_no_wait)
        task = asyncio.create_task(engine.run())
        gone = engine.submit(Sequence("gone", 10, 1000))
        await gone.tokens.get()
        engine.cancel(gone)
        kept = engine.submit(Sequence("kept", 10, 5))
        tokens = await _drain(kept)
        engine.stop()
        await task
        assert gone not in engine.running
        return len(tokens)

    assert asyncio.run(main()) == 5


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_scenarios_are_well_formed(name: str) -> None:
    s = scenarios.get(name)
    assert s.complaint and s.expect.dominant
    assert s.load.concurrency >= 1 or s.load.rate
    rng = random.Random(1)
    from latscope.demo.load import sample_length

    lengths = [sample_length(rng, s.load.prompt) for _ in range(200)]
    assert min(lengths) >= s.load.prompt.low and max(lengths) <= s.load.prompt.high


def test_unknown_scenario_names_the_choices() -> None:
    with pytest.raises(ValueError, match="choose one of healthy"):
        scenarios.get("nope")
