"""The repository's worker entry point: `python worker.py [ARGS]` is
`turnstile worker [ARGS]` (the code is turnstile.cli.worker; the package is
what `pip install` installs, this file is not)."""

from turnstile.cli.worker import main

if __name__ == "__main__":
    main()
