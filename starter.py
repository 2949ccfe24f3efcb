"""The repository's command-line entry point: `python starter.py COMMAND ...`
is `turnstile COMMAND ...` (the code is turnstile.cli.starter; the package is
what `pip install` installs, this file is not)."""

from turnstile.cli.starter import run_main

if __name__ == "__main__":
    run_main()
