"""A workflow of a team's own, unrelated to turns (tests/test_temporal_plugin.py
runs it on the worker that also runs turns). Its own module: Temporal's sandbox
imports a workflow's module afresh for each run."""

from temporalio import workflow


@workflow.defn
class Greet:
    @workflow.run
    async def run(self, name: str) -> str:
        return f"hello {name}"
