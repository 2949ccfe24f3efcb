"""The repository's name for turnstile.activities (everything in a turn that
touches the world).

Not installed: `pip install` gives the `turnstile` namespace only. In the
checkout, `activities` and `activities.X` are the very modules
turnstile.activities and turnstile.activities.X."""

from turnstile._aliases import alias_package
from turnstile.activities import Runtime, all_activities

__all__ = ["Runtime", "all_activities"]

alias_package(__name__, "turnstile.activities")
