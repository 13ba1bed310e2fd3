"""`python -m cli`: the `deepseek-tfx` command."""

import sys

from cli import entry

sys.exit(entry())
