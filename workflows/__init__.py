"""Workflow definitions (deterministic code only)."""

from workflows.agent_turn import AgentTurn

__all__ = ["AgentTurn"]
