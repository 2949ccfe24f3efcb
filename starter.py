"""The repository's command-line entry point: `python starter.py COMMAND ...`
is `turnstile COMMAND ...`. The code is turnstile.cli.starter, which `import
starter` gives in the checkout too; the package is what `pip install`
installs, this file is not."""

import sys

from turnstile.cli import starter

if __name__ == "__main__":
    starter.run_main()
else:
    sys.modules[__name__] = starter
