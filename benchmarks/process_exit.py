"""How long a `deepseek-tfx run` takes to end after its last line, with and without
`gc.freeze()` before the exit (`common/process_exit.py`), side by side.

  python benchmarks/process_exit.py [--data PATH] [--train-steps 2] [--repeats 2]

Each repeat runs the same tiny-preset pipeline twice in fresh processes, in turn:

  default   `sys.exit(entry())`: Python collects every reference cycle at exit
  frozen    `exit_frozen(entry())`, what `deepseek-tfx` and `python -m cli` do

and prints, per process, its wall seconds, the seconds from its last console line
(`log: ...`) to its end, and how many `__autograph_generated_file*.py` files it left in
the temporary directory (the atexit handlers that remove them must still run: 0).
`--data` defaults to the first 60,000 bytes of Tiny Shakespeare in `../shared/corpora`.
"""

from __future__ import annotations

import argparse
import glob
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"
MODES = {
    "default": "import sys; from cli import entry; sys.exit(entry())",
    "frozen": "from cli import command; command()",
}


def measure(mode: str, data: str, train_steps: int, workdir: str) -> dict:
    """One run in a fresh process: {"wall_s", "after_last_line_s", "autograph_files_left"}."""
    pattern = str(pathlib.Path(tempfile.gettempdir()) / "__autograph_generated_file*.py")
    before = set(glob.glob(pattern))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", MODES[mode], "run", "--data", data,
         "--output", workdir, "--preset", "tiny", "--set", f"train.train_steps={train_steps}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last_line = start
    for _ in proc.stdout:
        last_line = time.perf_counter()
    code = proc.wait()
    end = time.perf_counter()
    if code:
        raise SystemExit(f"{mode}: the run exited with {code}")
    return {"wall_s": end - start, "after_last_line_s": end - last_line,
            "autograph_files_left": len(set(glob.glob(pattern)) - before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--train-steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        data = args.data
        if data is None:
            text = SHAKESPEARE.read_text(encoding="utf-8")[:60_000]
            data = str(pathlib.Path(d) / "slice.txt")
            pathlib.Path(data).write_text(text[: text.rfind("\n\n") + 2], encoding="utf-8")
        print("| repeat | exit | wall s | last line to exit s | autograph files left |")
        print("|---|---|---|---|---|")
        for repeat in range(1, args.repeats + 1):
            for mode in MODES:
                r = measure(mode, data, args.train_steps, f"{d}/{mode}-{repeat}")
                print(f"| {repeat} | {mode} | {r['wall_s']:.1f} | {r['after_last_line_s']:.2f} "
                      f"| {r['autograph_files_left']} |", flush=True)


if __name__ == "__main__":
    main()
