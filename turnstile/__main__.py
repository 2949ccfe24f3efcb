"""`python -m turnstile COMMAND ...`: the `turnstile` console script."""

from turnstile.cli.main import main

main()
