"""The docs against the code: every `deepseek-tfx` command line in README.md and docs/
parses, the generated reference pages are fresh, every benchmark they name exists and
its command lines parse, and README.md stays a short front page.

Which lines are commands (`command_lines`): every line of a page, inside a fenced code
block or not, after joining `\\` continuations and dropping a leading `$ ` prompt, whose
text starts with `deepseek-tfx` (optionally behind `python3 -m uv run`, `uv run`,
`.venv/bin/` or `VAR=value`), or has it right after a shell operator (`&&`, `|`, `;`, `&`).
`deepseek-tfx` mid-sentence (`` `deepseek-tfx run` keeps ...``) and table rows are prose.
Shell comments (`# ...`) and redirections are dropped. A line written as a synopsis (a
`[...]` group, `...` or `{a|b}`, as `--help` prints) is not run through the parser: its
subcommand and every flag it names must exist. Elsewhere an upper-case placeholder value
(`--train-steps N`, `--port PORT`) passes a typed argument; choices stay checked.

Benchmark command lines: every line as above, and every inline code span, that runs
`python benchmarks/NAME.py ...` or `python -m benchmarks.NAME ...` (behind the same
prefixes); the arguments parse with that benchmark's parser, rebuilt from the
`add_argument` calls in its source (`benchmark_parser`): importing a benchmark would
import TensorFlow.

No TensorFlow: `cli.build_parser()` and `config` import neither.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tools import gen_docs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
PAGE_IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]

SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
PREFIXES = (("python3", "-m", "uv", "run"), ("python", "-m", "uv", "run"), ("uv", "run"))
PYTHONS = {"python", "python3", ".venv/bin/python", ".venv/bin/python3"}
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
COMMAND_START = re.compile(
    r"(?:^|&&|\|\||[;|&])\s*(?:[A-Za-z_]\w*=\S*\s+)*"
    r"(?:python3? -m uv run\s+|uv run\s+|\.venv/bin/)?deepseek-tfx(?:\s|$)")
FENCE = re.compile(r"^\s*(```|~~~)")

README_MAX_LINES = 250
README_MAX_WIDTH = 120
SETUP = "python3 -m pip install uv && python3 -m uv sync --locked && python3 -m uv run"


# --- Reading the pages --------------------------------------------------------------------

def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, `\\` continuations joined, a leading `$ `
    prompt dropped."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        line = line.strip()
        out.append((start + 1, line[2:] if line.startswith("$ ") else line))
        i += 1
    return out


def inline_code(text: str) -> list[tuple[int, str]]:
    """(line number, content) of each inline code span outside fenced blocks; a span may
    wrap onto the next line of its paragraph."""
    lines, fenced = text.splitlines(), False
    kept = []
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else line)
    prose = "\n".join(kept)
    return [(prose.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split()))
            for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.S)]


def shell_segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line: split at `&&`, `|`, `;`, `&`, comments and
    redirections dropped, leading `VAR=value` assignments dropped.

    Raises:
      ValueError: unbalanced quotes.
    """
    segments: list[list[str]] = [[]]
    tokens = shlex.split(line, comments=True)
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in SHELL_OPERATORS:
            segments.append([])
        elif token in (">", ">>", "<", "2>", "2>>", "&>"):
            skip = True  # and its file
        elif not re.fullmatch(r"\d*>>?&?\S+|<\S+", token):
            segments[-1].append(token)
    out = []
    for seg in segments:
        while seg and re.fullmatch(r"[A-Za-z_]\w*=\S*", seg[0]):
            seg = seg[1:]
        if seg:
            out.append(seg)
    return out


def without_prefix(tokens: list[str]) -> list[str]:
    """`tokens` without a leading `python3 -m uv run` / `uv run`."""
    for prefix in PREFIXES:
        if tuple(tokens[:len(prefix)]) == prefix:
            return tokens[len(prefix):]
    return tokens


def command_lines(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, line, arguments after `deepseek-tfx`) of each `deepseek-tfx` command
    on a page (the module docstring says which lines count)."""
    found = []
    for number, line in logical_lines(text):
        if line.startswith("|") or not COMMAND_START.search(line):
            continue
        try:
            segments = shell_segments(line)
        except ValueError as e:
            found.append((number, line, [f"<unparsable shell line: {e}>"]))
            continue
        for seg in segments:
            seg = without_prefix(seg)
            if seg and seg[0] in ("deepseek-tfx", ".venv/bin/deepseek-tfx"):
                found.append((number, line, seg[1:]))
    return found


def is_synopsis(args: list[str]) -> bool:
    """A usage synopsis (`[--flag X]`, `...`, `{a|b}`), not a runnable command."""
    return any(a == "..." or a.endswith("...") or a.startswith(("[", "{")) or a.endswith("]")
               for a in args)


# --- Parsing ------------------------------------------------------------------------------

def tolerate_placeholders(parser: argparse.ArgumentParser) -> None:
    """Lets an upper-case placeholder (`N`, `PORT`) pass every typed argument of `parser`
    and its subcommands (choices are still checked)."""
    actions = list(gen_docs.arguments(parser))
    with contextlib.suppress(StopIteration):
        actions += [a for _, _, sub in gen_docs.subcommands(parser)
                    for a in gen_docs.arguments(sub)]
    for action in actions:
        if callable(action.type):
            action.type = _placeholder_ok(action.type)


def _placeholder_ok(convert):
    def parse(value: str):
        return value if PLACEHOLDER.fullmatch(value) else convert(value)
    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """argparse's message when `args` do not parse (None when they do; `--help` does)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(e)
    return None


def synopsis_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """For a `deepseek-tfx` synopsis: its subcommand exists and so does every flag it
    names."""
    subs = {name: sub for name, _, sub in gen_docs.subcommands(parser)}
    if not args or args[0] not in subs:
        return f"unknown subcommand {args[0] if args else '(none)'!r}"
    return unknown_flags(subs[args[0]], args[1:])


def unknown_flags(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """The flags `args` name (in `[--flag X]`, `{-a|--b}` too) that `parser` lacks."""
    flags = {f for a in gen_docs.arguments(parser) for f in a.option_strings}
    named = {f.split("=")[0] for a in args for f in re.split(r"[\[\]{}()|]", a)
             if f.startswith("-") and f not in ("-", "--")}
    unknown = sorted(named - flags - {"-h", "--help"})
    return f"{parser.prog} has no {', '.join(unknown)}" if unknown else None


def cli_parser() -> argparse.ArgumentParser:
    import cli

    parser = cli.build_parser()
    tolerate_placeholders(parser)
    return parser


SAMPLE_PAGE = """\
Prose that mentions `deepseek-tfx run --no-such-flag` mid-sentence is not checked,
deepseek-tfx run --preset tiny --train-steps N   # a comment --no-such-flag
| `deepseek-tfx run --no-such-flag` | a table row |
```bash
$ python3 -m uv run deepseek-tfx run --preset tiny \\
    --set train.seq_len=32
printf 'hi\\n' | uv run deepseek-tfx chat --model DIR > out.txt 2>&1 &
deepseek-tfx serve --model DIR [--port P] [--max-batch-size ROWS]
deepseek-tfx generate --model DIR --prompt hi --bogus
deepseek-tfx hf-export A B [--dtype auto|float32] [--nope X]
deepseek-tfx run --runner nowhere
```
"""


def test_command_lines_are_found_and_checked():
    """The rules of `command_lines` and the checks on a sample page: prose and tables
    are skipped; prompts, continuations, pipes, comments and redirections handled;
    synopses checked flag by flag; bad flags and choices caught."""
    parser = cli_parser()
    found = [(n, args) for n, _, args in command_lines(SAMPLE_PAGE)]
    assert [n for n, _ in found] == [2, 5, 7, 8, 9, 10, 11]
    assert found[0][1] == ["run", "--preset", "tiny", "--train-steps", "N"]
    assert found[1][1] == ["run", "--preset", "tiny", "--set", "train.seq_len=32"]
    assert found[2][1] == ["chat", "--model", "DIR"]
    errors = [(synopsis_error if is_synopsis(args) else parse_error)(parser, args)
              for _, args in found]
    assert errors[:4] == [None, None, None, None]
    assert "--bogus" in errors[4] and "--nope" in errors[5] and "nowhere" in errors[6]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_deepseek_tfx_commands_parse(page):
    """Every `deepseek-tfx` command line on the page parses (a synopsis names only
    existing flags)."""
    parser = cli_parser()
    failures = []
    for number, line, args in command_lines(page.read_text(encoding="utf-8")):
        check = synopsis_error if is_synopsis(args) else parse_error
        error = check(parser, args)
        if error:
            failures.append(f"{page.relative_to(ROOT)}:{number}: {line}\n    -> {error}")
    assert not failures, "commands that do not parse:\n" + "\n".join(failures)


# --- The generated pages ------------------------------------------------------------------

def test_generated_pages_are_fresh():
    """docs/reference/config.md and cli.md equal a fresh `python -m tools.gen_docs`."""
    stale = gen_docs.stale_pages(ROOT)
    assert not stale, (f"stale generated pages {stale}: run `python -m tools.gen_docs` "
                       "and commit the result")


def test_generated_pages_name_no_local_path():
    """Generation is deterministic and machine-independent: twice the same, and no
    absolute path of this checkout or home directory in it."""
    first, second = gen_docs.generate(), gen_docs.generate()
    assert first == second
    for path, text in first.items():
        assert text.startswith("<!-- Generated by `python -m tools.gen_docs`"), path
        for local in {str(ROOT), str(Path.home())}:
            assert local not in text, f"{path} names {local}"


def test_every_config_field_is_documented():
    """A config field without an `Attributes:` entry in its class docstring fails (the
    reference page would say it has no description)."""
    text = gen_docs.generate()[gen_docs.CONFIG_PAGE]
    undocumented = set(re.findall(r"^\| `([\w.\[\]]+)` \|.*" + re.escape(
        gen_docs.NO_DESCRIPTION), text, re.M))
    assert not undocumented, sorted(undocumented)


# --- Benchmarks ---------------------------------------------------------------------------

BENCHMARKS = ROOT / "benchmarks"
NOT_MODULES = {"md", "py", "html", "json", "txt", "yml", "yaml", "jsonl"}


def named_benchmarks(text: str) -> set[str]:
    """The benchmarks a page names: `benchmarks/NAME.py` and `benchmarks.NAME`."""
    names = set(re.findall(r"\bbenchmarks/(\w+)\.py\b", text))
    names |= {n for n in re.findall(r"(?<![\w/.-])benchmarks\.([a-z_][a-z0-9_]*)\b(?!\.\w)",
                                    text) if n not in NOT_MODULES}
    return names


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_named_benchmarks_exist(page):
    missing = sorted(n for n in named_benchmarks(page.read_text(encoding="utf-8"))
                     if not (BENCHMARKS / f"{n}.py").is_file())
    assert not missing, f"{page.relative_to(ROOT)} names benchmarks that do not exist: {missing}"


def benchmark_commands(text: str) -> list[tuple[int, str, str, list[str]]]:
    """(line number, line, benchmark name, its arguments) of each benchmark command line
    and inline code span on a page."""
    found = []
    candidates = logical_lines(text) + inline_code(text)
    for number, line in candidates:
        if "benchmarks" not in line or line.startswith("|"):
            continue
        try:
            segments = shell_segments(line)
        except ValueError:
            continue  # prose with an apostrophe
        for seg in segments:
            seg = without_prefix(seg)
            if len(seg) < 2 or seg[0] not in PYTHONS:
                continue
            m = re.fullmatch(r"(?:\./)?benchmarks/(\w+)\.py", seg[1])
            if m:
                found.append((number, line, m.group(1), seg[2:]))
            elif seg[1] == "-m" and len(seg) > 2 and seg[2].startswith("benchmarks."):
                found.append((number, line, seg[2].split(".", 1)[1], seg[3:]))
    return found


def _literal(node: ast.AST, constants: dict):
    """A literal, a module constant, or `sorted/list/tuple(...)` of one (a dict whose
    values are not literals gives its keys); else raises."""
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        with contextlib.suppress(ValueError):
            return ast.literal_eval(node)
        return {k.value: None for k in node.keys}
    if isinstance(node, ast.Name):
        if node.id in constants:
            return constants[node.id]
        return {"int": int, "float": float, "str": str}[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "sorted", "list", "tuple") and len(node.args) == 1:
        return list(_literal(node.args[0], constants))
    return ast.literal_eval(node)


def benchmark_parser(name: str) -> argparse.ArgumentParser | None:
    """The parser of benchmarks/NAME.py rebuilt from its `add_argument` calls (without
    importing it); None when it builds none. Keyword values that are not literals (a
    `Path` type, a computed default) are left out: the argument then takes any text."""
    tree = ast.parse((BENCHMARKS / f"{name}.py").read_text(encoding="utf-8"))
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            with contextlib.suppress(Exception):
                constants[node.targets[0].id] = _literal(node.value, constants)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]
    if not any(isinstance(n, ast.Attribute) and n.attr == "ArgumentParser"
               for n in ast.walk(tree)):
        return None
    parser = argparse.ArgumentParser(prog=f"benchmarks/{name}.py")
    for call in sorted(calls, key=lambda c: c.lineno):
        names = [ast.literal_eval(a) for a in call.args]
        kwargs = {}
        for kw in call.keywords:
            if kw.arg in ("action", "nargs", "choices", "type", "required", "dest", "metavar"):
                with contextlib.suppress(Exception):
                    kwargs[kw.arg] = _literal(kw.value, constants)
        if kwargs.get("type") not in (None, int, float, str):
            kwargs.pop("type")
        parser.add_argument(*names, **kwargs)
    tolerate_placeholders(parser)
    return parser


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_benchmark_commands_parse(page):
    """Every benchmark command line on the page parses with the benchmark's arguments."""
    failures = []
    for number, line, name, args in benchmark_commands(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(ROOT)}:{number}: {line}"
        if not (BENCHMARKS / f"{name}.py").is_file():
            failures.append(f"{where}\n    -> no benchmarks/{name}.py")
            continue
        parser = benchmark_parser(name)
        if parser is None:
            if args:
                failures.append(f"{where}\n    -> benchmarks/{name}.py takes no arguments")
            continue
        error = (unknown_flags if is_synopsis(args) else parse_error)(parser, args)
        if error:
            failures.append(f"{where}\n    -> {error}")
    assert not failures, "benchmark commands that do not parse:\n" + "\n".join(failures)


def test_benchmark_parsers_rebuild():
    """Every benchmark with a parser rebuilds (its add_argument calls are literal enough),
    and the rebuilt parser checks flags, types and choices."""
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name != "__init__.py":
            benchmark_parser(path.stem)
    parser = benchmark_parser("v4_checkpoint")
    assert parse_error(parser, ["OUT", "--size", "tiny", "--seed", "N"]) is None
    assert "invalid choice" in parse_error(parser, ["OUT", "--size", "huge"])
    assert "invalid int" in parse_error(parser, ["OUT", "--seed", "one"])
    assert "unrecognized" in parse_error(parser, ["OUT", "--nope"])
    page = "Run `python benchmarks/peak_probe.py --rounds 2` or\n\n" \
           "```\n.venv/bin/python -m benchmarks.moe_scaling --steps 3  # fast\n```\n"
    assert [(n, name, args) for n, _, name, args in benchmark_commands(page)] == [
        (4, "moe_scaling", ["--steps", "3"]), (1, "peak_probe", ["--rounds", "2"])]


# --- README.md, the front page ------------------------------------------------------------

SHELL_FENCE = re.compile(r"\s*(```|~~~)\s*(bash|sh|shell|console|zsh)\b")


def shell_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block tagged as shell (```bash, ```sh, ...), in order."""
    blocks, current, fenced = [], None, False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            if fenced and SHELL_FENCE.match(line):
                current = []
            elif not fenced and current is not None:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move detail to docs/")


def test_readme_lines_are_narrow():
    """No line over README_MAX_WIDTH characters outside fenced code blocks."""
    fenced, wide = False, []
    for number, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and len(line) > README_MAX_WIDTH:
            wide.append(f"README.md:{number} ({len(line)} characters)")
    assert not wide, f"lines over {README_MAX_WIDTH} characters:\n" + "\n".join(wide)


def test_readme_starts_with_the_setup_commands():
    """The first two shell blocks are the one-line set-ups: the main job, then the tests
    (comment lines and trailing `  # comments` aside)."""
    blocks = shell_blocks(README.read_text(encoding="utf-8"))
    commands = [[line.split("  #")[0].strip() for line in block
                 if line.strip() and not line.strip().startswith("#")] for block in blocks[:2]]
    assert commands == [[f"{SETUP} deepseek-tfx run"], [f"{SETUP} pytest"]], commands
