"""Which CLI commands are quiet, and where their logs go.

A quiet command (`QUIET_COMMANDS`) shows only the project's own lines on the console and
runs inside `cli.console.session`, which sends the libraries' output to a log file:
`log_path` names that file, under `--log-dir`, `<--output>/logs` or `default_log_dir()`.
`add_arguments` gives a quiet command its `--verbose` and `--log-dir`.
"""

from __future__ import annotations

import dataclasses
import os
import time


@dataclasses.dataclass(frozen=True)
class Quiet:
    """How a command's console is kept quiet.

    Attributes:
      logs_under_output: the log goes to `<--output>/logs/`; otherwise to `--log-dir`
        (default `default_log_dir()`).
      announce: print the log's path when the command starts and when it ends (long
        commands); otherwise only when it fails.
    """

    logs_under_output: bool = False
    announce: bool = False


# The commands whose console shows only the project's own lines. A new command
# joins with one line here (and `add_arguments` on its parser).
QUIET_COMMANDS: dict[str, Quiet] = {
    "run": Quiet(logs_under_output=True, announce=True),
    "validate": Quiet(logs_under_output=True, announce=True),
    "serve": Quiet(announce=True),
    "evaluate": Quiet(),
    "compare": Quiet(),
    "generate": Quiet(),
    "hf-import": Quiet(),
    "hf-export": Quiet(),
    "prune": Quiet(),
    "chat": Quiet(),
    "report": Quiet(logs_under_output=True),
    "compile-kfp": Quiet(),
}


LOG_DIR_ENV = "DEEPSEEK_TFX_LOG_DIR"

def default_log_dir() -> str:
    """`$DEEPSEEK_TFX_LOG_DIR` when set, else `$XDG_CACHE_HOME/deepseek-tfx/logs`, by
    default `~/.cache/deepseek-tfx/logs`."""
    if os.environ.get(LOG_DIR_ENV):
        return os.environ[LOG_DIR_ENV]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "deepseek-tfx", "logs")


def add_arguments(parser, command: str) -> None:
    """`--verbose`, and `--log-dir`, on the parser of a command of `QUIET_COMMANDS`."""
    quiet = QUIET_COMMANDS[command]
    where = "<output>/logs" if quiet.logs_under_output else default_log_dir()
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the libraries' logs and warnings on the console too "
                        "(they always go to the log file)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help=f"where the log file {command}-YYYYmmdd-HHMMSS.log goes "
                        f"(default {where})")


def log_path(command: str, log_dir: str, when: float | None = None) -> str:
    """`<log_dir>/<command>-<YYYYmmdd-HHMMSS>.log` (absolute; `-2`, `-3`... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    base = os.path.join(os.path.abspath(os.path.expanduser(log_dir)), f"{command}-{stamp}")
    path, n = base + ".log", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.log"
    return path
