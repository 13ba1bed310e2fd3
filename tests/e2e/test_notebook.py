"""End to end: `notebooks/walkthrough.ipynb` runs from top to bottom and shows real results.

The notebook is executed with nbclient in a fresh kernel of this venv's interpreter
(a temporary kernelspec names `sys.executable`, so no other Python's kernel can be
picked up), from a temporary working directory, with TMPDIR pointing there so its
outputs are written there too. Any cell that raises fails the test. Then the outputs
are checked: the kernel's interpreter, the cleaning report's counts reconcile with
the examples read, no anomalies, the learned tokenizer round-trips a sentence, the
loss falls and is plotted, a finite perplexity and bits per byte, a generation, and
the ML Metadata lineage of the pushed model reaches the input file with its SHA-256.
The committed notebook must carry no outputs.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
import time
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "walkthrough.ipynb"
CELL_TIMEOUT_S = 900  # the Trainer cell: ~1 min on an idle 2-core machine
KERNEL_NAME = "deepseek-tfx-test-venv"


def test_committed_notebook_has_no_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.outputs or c.execution_count is not None)]
    assert not dirty, (f"{NOTEBOOK.name}: cells {dirty} carry outputs or execution counts; "
                       "clear them before committing (e.g. jupyter nbconvert --clear-output)")


def _venv_kernel_manager(kernels_dir: Path):
    """A KernelManager whose only kernelspec runs ipykernel on `sys.executable`."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = kernels_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "deepseek-tfx venv (test)",
        "language": "python",
    }))
    specs = KernelSpecManager(kernel_dirs=[str(kernels_dir)])
    assert specs.get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


@pytest.fixture(scope="module")
def executed(tmp_path_factory, shakespeare):
    """The executed notebook and its wall time; fails on the first cell that raises."""
    import nbformat
    from nbclient import NotebookClient

    workdir = tmp_path_factory.mktemp("notebook_cwd")
    tmp = workdir / "tmp"
    tmp.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("TMPDIR", str(tmp))  # the kernel inherits it: tempfile.mkdtemp() lands here
    km = None
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        km = _venv_kernel_manager(workdir / "kernels")
        client = NotebookClient(
            nb,
            km=km,
            timeout=CELL_TIMEOUT_S,
            allow_errors=False,
            resources={"metadata": {"path": str(workdir)}},
        )
        start = time.perf_counter()
        client.execute()  # raises CellExecutionError naming the cell that failed
        wall = time.perf_counter() - start
    finally:
        mp.undo()
        # nbclient leaves a kernel it was handed running (~3 GB resident after the
        # notebook's pipeline run): stop it, so the rest of the suite has that memory.
        if km is not None and km.has_kernel:
            km.shutdown_kernel(now=True)
    print(f"\nnotebook executed in {wall:.0f} s")
    return nb, wall, tmp


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream" and o.name == "stdout")


def _match(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text, re.MULTILINE)
    assert m, f"the notebook's output has no line matching {pattern!r}"
    return m


def test_every_cell_ran_without_error(executed):
    nb, wall, _ = executed
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert wall < len(code) * CELL_TIMEOUT_S


def test_kernel_is_this_venv(executed):
    out = _stdout(executed[0])
    assert _match(r"^python: (.+)$", out).group(1) == sys.executable


def test_data_statistics_and_cleaning_reconcile(executed):
    out = _stdout(executed[0])
    counts = ast.literal_eval(_match(r"^examples per split: (\{.*\})$", out).group(1))
    assert set(counts) == {"train", "eval"} and counts["train"] > 5 * counts["eval"] > 0
    for split, n in counts.items():
        assert int(_match(rf"^split {split}: (\d+) examples$", out).group(1)) == n
        assert int(_match(rf"^split {split}: (\d+) anomalies", out).group(1)) == 0
    rows = {}
    for name in ("train", "eval", "total"):
        m = _match(rf"^{name}\s+read\s+(\d+)\s+kept\s+(\d+)\s+dropped\s+(\d+)", out)
        read, kept, dropped = map(int, m.groups())
        assert read == kept + dropped, m.group(0)
        rows[name] = (read, kept, dropped)
    assert rows["train"][0] == counts["train"] and rows["eval"][0] == counts["eval"]
    assert rows["total"] == tuple(a + b for a, b in zip(rows["train"], rows["eval"], strict=True))
    assert rows["total"][1] > 0.9 * rows["total"][0]


def test_tokenizer_round_trip(executed):
    from config import get_config

    out = _stdout(executed[0])
    vocab = int(_match(r"^byte-level BPE: (\d+) tokens", out).group(1))
    assert vocab == get_config("tiny").tokenizer.vocab_size
    assert "decoded == sentence: True" in out


def test_training_loss_falls_and_is_plotted(executed):
    nb = executed[0]
    out = _stdout(nb)
    m = _match(r"^loss: step (\d+) ([\d.]+) -> step (\d+) ([\d.]+);", out)
    first, last = float(m.group(2)), float(m.group(4))
    assert int(m.group(3)) == int(_match(r"^(\d+) steps \(", out).group(1))
    assert math.isfinite(last) and last < first - 0.5, m.group(0)
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert images, "no matplotlib figure (the loss curve) in the outputs"


def test_evaluation_and_generation(executed):
    out = _stdout(executed[0])
    perplexity = float(_match(r"^perplexity\s+(\S+)$", out).group(1))
    bits_per_byte = float(_match(r"^bits per byte\s+(\S+)", out).group(1))
    assert math.isfinite(perplexity) and perplexity > 1
    assert math.isfinite(bits_per_byte) and 0 < bits_per_byte < 8
    assert _match(r"^blessed:\s+(\w+)", out).group(1) == "True"
    _match(r"^pushed: (.+/serving/\d+)$", out)
    generated = [int(n) for n in re.findall(r"^--- (\d+) new tokens:\nROMEO:\n", out, re.MULTILINE)]
    assert generated and generated[0] >= 1, "no generation from the prompt 'ROMEO:'"


def test_lineage_reaches_the_input_file(executed):
    nb, _, tmp = executed
    out = _stdout(nb)
    for component in ("Pusher", "LmEvaluator", "Trainer", "Transform", "TextCleaner",
                      "TextExampleGen"):
        _match(rf"^  <- {component} \(execution \d+\)$", out)
    m = _match(r"^slice:\s+(\S+) \(([\d,]+) bytes", out)
    data_file, size = Path(m.group(1)), int(m.group(2).replace(",", ""))
    assert data_file.is_relative_to(tmp), f"{data_file} is not under TMPDIR {tmp}"
    m = _match(r"^  input file (\S+)  (\d+) bytes  sha256 ([0-9a-f]{64})$", out)
    assert (m.group(1), int(m.group(2))) == (data_file.name, size)
    import hashlib

    assert m.group(3) == hashlib.sha256(data_file.read_bytes()).hexdigest()
    assert "the recorded SHA-256 is the file's: True" in out
