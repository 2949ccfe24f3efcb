"""Typed answers (steps 9 and 16). Pure helpers: the workflow uses the first
half (what the model is told), the `turnstile.parse_output` activity the
second (reading the answer into the service's pydantic type).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from turnstile.engine.pipeline_spec import OutputSpec

FORMAT_INSTRUCTIONS = (
    "\n\nAnswer with only a JSON object (no prose, no code fences) that matches this "
    "JSON schema:\n{schema}"
)
PARSE_REASK = (
    "Your previous answer could not be read as {type_name}: {error}\n"
    "Answer again with only a JSON object that matches the schema."
)


def output_spec(output_type: type[BaseModel],
                mode: Literal["auto", "json_schema", "instructions"],
                provider_takes_schema: bool) -> OutputSpec:
    """Step 9's decision, made by the worker (it knows its provider) and
    recorded in history with the service spec."""
    use_schema = mode == "json_schema" or (mode == "auto" and provider_takes_schema)
    return OutputSpec(type_name=output_type.__name__,
                      json_schema=output_type.model_json_schema(),
                      mode="json_schema" if use_schema else "instructions")


def format_instructions(spec: OutputSpec) -> str:
    return FORMAT_INSTRUCTIONS.format(schema=json.dumps(spec.json_schema, sort_keys=True))


def parse_reask(type_name: str, error: str) -> str:
    return PARSE_REASK.format(type_name=type_name, error=error)


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def json_text(answer: str) -> str:
    """The JSON object in an answer: fenced code, else from the first `{` to
    the last `}` (models often wrap the object in a sentence)."""
    fenced = _FENCE.search(answer)
    if fenced:
        return fenced.group(1).strip()
    start, end = answer.find("{"), answer.rfind("}")
    return answer[start:end + 1] if 0 <= start < end else answer.strip()


def parse_answer(answer: str, output_type: type[BaseModel]) -> dict[str, Any]:
    """The answer as the type's JSON object; raises ValueError with a message
    the model can act on."""
    text = json_text(answer)
    try:
        value = output_type.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:8])
        raise ValueError(problems) from exc
    return value.model_dump(mode="json")
