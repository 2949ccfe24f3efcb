"""A web backend's turn, through turnstile.client (shown in README.md, run by
tests/test_client.py): start a turn for a user's message, stream its events
to the user as they happen, answer with the result."""

from collections.abc import AsyncIterator

from turnstile import TurnEndedError, TurnInput, TurnstileClient


async def chat(client: TurnstileClient, conversation: str, user: str,
               text: str) -> AsyncIterator[str]:
    """What the backend sends its user: progress lines, then the answer."""
    turn = await client.start_turn(TurnInput(conversation_id=conversation, user_id=user,
                                             message=text))
    async for event in turn.events():  # resumable: turn.events(offset=n), ends with the end
        if event.step in ("model_call", "tool_call", "awaiting_approval", "approval"):
            yield f"[{event.step}] {event.detail}"
    try:
        result = await turn.result()  # follows an operator's reset to the new run
    except TurnEndedError as ended:  # cancelled, terminated, timed out
        yield f"sorry: the turn was {ended.status.replace('_', ' ')}"
        return
    if result.status == "completed":
        yield str(result.answer)
    else:
        yield f"sorry: {result.error.message if result.error else result.status}"
