"""AgentDojo's suites (v1.2.2) run through real Turnstile turns.

    python -m bench.agentdojo [--suite S] [--model benign|compromised]
                              [--reviewer none|perfect] [--kill-worker N]

- `suites`: the suites, their (user task, injection task) pairs, the
  injected start environment of a pair, ground truths; the clock frozen.
- `store`: the environment of each run in the database, changed only inside
  a tool call's transaction, and the log of the calls that ran.
- `tools`: each suite's functions as Turnstile tools over that store.
- `oracles`: the benign and compromised scripted models.
- `reviewer`: the perfect reviewer (approves what serves the user task).
- `app`: the App a worker serves (one service per suite and model).
- `runner`: one pair as a real turn, then AgentDojo's own checks.
- `figures`: the per-suite figures and the known checker artefacts.
"""
