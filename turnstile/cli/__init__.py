"""The command line: `turnstile COMMAND ...` (turnstile.cli.main).

`turnstile worker` is turnstile.cli.worker (the worker process); every other
command is turnstile.cli.starter's. The repository's `python worker.py` and
`python starter.py ...` are the same two modules."""
