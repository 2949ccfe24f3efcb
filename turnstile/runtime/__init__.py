"""The runtime: what a worker process brings to a turn — settings from the
environment, the service registry and plugins, tool definitions, guardrail
and moderation runners, event listeners, tracing, the Temporal client and the
embedded dev stack. The runtime imports the stores and the engine, never the
reference app.
"""
