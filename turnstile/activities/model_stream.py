"""How the model activity asks the provider: at once, or streamed (step 8).

Streaming changes only where partial text goes (the `turn_stream` table);
the activity's result, and so the history, is the same final message.
"""

from __future__ import annotations

from temporalio import activity

from turnstile.activities.runtime import Runtime
from turnstile.engine.activity_io import ModelCallInput
from turnstile.providers import ModelProvider, ModelRequest, ModelResponse
from turnstile.stores.streaming import StreamWriter


async def request_model(rt: Runtime, provider: ModelProvider, req: ModelCallInput,
                        request: ModelRequest, workflow_id: str) -> ModelResponse:
    if not req.stream:
        return await provider.complete(request)
    writer = StreamWriter(rt.db, workflow_id, req.response_seq, activity.info().attempt)
    await writer.open()
    stream = getattr(provider, "stream", None)
    if stream is None:
        # A provider that cannot stream (the offline demo planner): the whole
        # answer arrives as one chunk, so followers still see it.
        response = await provider.complete(request)
        await writer.add(response.message.content or "")
    else:
        response = await stream(request, writer.add)
    await writer.close()
    return response
