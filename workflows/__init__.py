"""The repository's name for turnstile.workflows (the turn's workflow code).

Not installed: `pip install` gives the `turnstile` namespace only. In the
checkout, `workflows` and `workflows.X` are the very modules
turnstile.workflows and turnstile.workflows.X (one module object each, so
one `AgentTurn`), for scripts written against the layout the product was
specified with."""

from turnstile._aliases import alias_package
from turnstile.workflows import AgentTurn

__all__ = ["AgentTurn"]

alias_package(__name__, "turnstile.workflows")
