"""The engine: pure types and rules of a turn — messages, service specs and
policies, the loop's next-step rules, breakers, errors, events and the wire
types of the workflow, its activities, signals and queries.

Everything here is deterministic and importable by workflow code: no I/O,
clocks, randomness or environment reads, and no import of any other
turnstile layer.
"""
