"""Each suite's functions as Turnstile tools over the run's stored environment.

A tool is built from the AgentDojo function's own input schema (its
parameters, their types, defaults and descriptions) as `@tool` builds any
typed function: the model sees the same schema AgentDojo's models see. Every
tool is `transactional` (its effect is the `dojo_run` row written in the
call's transaction, `store.apply`) and `repeatable` (AgentDojo's tasks call
some tools twice with the same arguments). The result the model reads is
AgentDojo's own rendering (`tool_result_to_str`) with JSON as its dump
function (AgentDojo's default is YAML; its docstring offers `json.dumps`): a
result's fields are then readable by the product (`@tool(trusted_values=...)`
vouches for whole values under named keys of JSON results; Turnstile does
not parse YAML); an object result (`dict`) is JSON too, where AgentDojo
writes Python's repr. A text result (a web page) stays text. A function's error
goes back as an error result, as AgentDojo's runtime reports it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import yaml
from pydantic import Field

from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import Function, FunctionsRuntime
from bench.agentdojo import store, suites
from turnstile import Tool, ToolContext, ToolRegistry, ToolResult, tool

# name -> the `@tool` options a suite's tool adds (e.g. its sensitive arguments).
ToolRules = Mapping[str, Mapping[str, Any]]


def suite_tools(suite_name: str, rules: ToolRules | None = None) -> ToolRegistry:
    s = suites.suite(suite_name)
    runtime = FunctionsRuntime(s.tools)
    return ToolRegistry(dojo_tool(runtime, f, (rules or {}).get(f.name, {})) for f in s.tools)


def dojo_tool(runtime: FunctionsRuntime, function: Function[..., Any],
              options: Mapping[str, Any]) -> Tool:
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=ToolContext)]
    for name, f in function.parameters.model_fields.items():
        annotation: Any = f.annotation
        if f.description:
            annotation = Annotated[annotation, Field(description=f.description)]
        default = inspect.Parameter.empty if f.is_required() else f.default
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=annotation, default=default))
    run = _runner(runtime, function.name)
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__name__ = function.name
    return tool(name=function.name, description=function.description, transactional=True,
                repeatable=True, **options)(run)


def _runner(runtime: FunctionsRuntime, name: str) -> Callable[..., Any]:
    def run(ctx: ToolContext, **arguments: Any) -> Any:
        def call(env: Any) -> tuple[Any, str | None]:
            ran: tuple[Any, str | None] = runtime.run_function(env, name, arguments,
                                                               raise_on_error=False)
            return ran

        with ctx.transaction() as conn:
            result, error = store.apply(conn, ctx.conversation_id, ctx.idempotency_key, name,
                                        arguments, call)
        if error is not None:
            return ToolResult(content=error, is_error=True)
        return rendered(result)

    return run


def rendered(result: Any) -> str:
    """What the model reads: AgentDojo's rendering, dumped as JSON (an
    object too, which AgentDojo writes as Python's repr)."""
    if isinstance(result, dict):
        return _json(result)
    return tool_result_to_str(result, dump_fn=_json)


def _json(value: Any) -> str:
    """A result as JSON (dates and times as text, as YAML wrote them)."""
    return json.dumps(value, default=str, ensure_ascii=False)


def parsed_result(text: str) -> Any:
    """A result's text parsed: JSON (this adapter's), else YAML (results
    recorded before it rendered JSON); None when neither parses."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None
