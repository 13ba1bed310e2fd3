"""`python -m cli`: the `deepseek-tfx` command."""

from cli import command

command()
