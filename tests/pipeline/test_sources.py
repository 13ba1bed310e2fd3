"""The source fingerprint that re-runs Transform and the Trainer after an edit of the code
they run (and only then): pipeline/sources.py."""

from __future__ import annotations

import pytest

from pipeline import sources


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_closure_follows_imports_in_functions_relative_imports_and_packages(tmp_path):
    _write(tmp_path, "app/__init__.py", "")
    _write(tmp_path, "app/entry.py", "import json\nfrom app import helper\n"
                                     "def f():\n    from lib.deep import thing\n")
    _write(tmp_path, "app/helper.py", "from . import sibling\n")
    _write(tmp_path, "app/sibling.py", "x = 1\n")
    _write(tmp_path, "app/unused.py", "import app.entry\n")
    _write(tmp_path, "lib/__init__.py", "")
    _write(tmp_path, "lib/deep.py", "thing = 1\n")
    _write(tmp_path, "lib/notes.txt", "not code\n")
    assert sources.source_files(("app.entry",), str(tmp_path)) == [
        "app/__init__.py", "app/entry.py", "app/helper.py", "app/sibling.py",
        "lib/__init__.py", "lib/deep.py"]
    first = sources.source_fingerprint(("app.entry",), str(tmp_path))
    _write(tmp_path, "app/unused.py", "edited, but not imported\n")
    _write(tmp_path, "lib/notes.txt", "edited, not code\n")
    assert sources.source_fingerprint(("app.entry",), str(tmp_path)) == first
    _write(tmp_path, "lib/deep.py", "thing = 2\n")
    assert sources.source_fingerprint(("app.entry",), str(tmp_path)) != first
    with pytest.raises(ModuleNotFoundError, match="app.missing"):
        sources.source_files(("app.missing",), str(tmp_path))


def test_the_trainer_runs_the_model_and_the_savedmodel_export_but_not_the_server():
    # Editing the HTTP server, chat, the CLI or the report keeps the Trainer's cache.
    from pipeline.pipeline import TRAINER_MODULES, TRANSFORM_MODULES

    trainer = sources.source_files(TRAINER_MODULES)
    for needed in ("components/trainer/run_fn.py", "components/trainer/worker.py",
                   "models/deepseek/moe.py", "tokenization/byte_pair_encoder.py",
                   "savedmodel/export.py", "config/__init__.py"):
        assert needed in trainer
    assert not [f for f in trainer if f.split("/")[0] in ("serving", "pipeline", "reporting", "cli")]
    transform = sources.source_files(TRANSFORM_MODULES)
    assert "tokenization/pre_tokenizer.py" in transform
    assert not [f for f in transform if f.startswith(("components/trainer", "savedmodel", "serving"))]
