"""`PeerTurn`: the workflow around pydantic-ai's TemporalAgent (bench/peer_turn.py)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bench.peer_turn import temporal_agent


@workflow.defn(name="PeerTurn")
class PeerTurn:
    @workflow.run
    async def run(self, message: str) -> str:
        result = await temporal_agent.run(message)
        return str(result.output)
