"""Workflow definitions (deterministic code only)."""

from turnstile.workflows.agent_turn import AgentTurn

__all__ = ["AgentTurn"]
