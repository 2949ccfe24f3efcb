"""The repository's worker entry point: `python worker.py [ARGS]` is
`turnstile worker [ARGS]`. The code is turnstile.cli.worker, which `import
worker` gives in the checkout too; the package is what `pip install`
installs, this file is not."""

import sys

from turnstile.cli import worker

if __name__ == "__main__":
    worker.main()
else:
    sys.modules[__name__] = worker
