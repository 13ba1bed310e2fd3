"""Supervised fine-tuning, end to end (tiny preset): a JSONL of {"context": line,
"response": next line} from Tiny Shakespeare trains with `--task sft`, is pushed,
and the pushed model answers a plain prompt through its chat template, in `generate` and
in `chat`."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest
from sft_records import shakespeare_sft_jsonl

import cli
from pipeline.local_runner import run_paths

RECORDS = 1500
ROOT = str(pathlib.Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, shakespeare):
    d = tmp_path_factory.mktemp("sft")
    data = d / "data" / "pairs.jsonl"
    data.parent.mkdir()
    shakespeare_sft_jsonl(data, RECORDS)
    with open(data, "a", encoding="utf-8") as f:  # two bad records, counted with reasons
        f.write(json.dumps({"context": "Speak.", "response": "   "}) + "\n")
        f.write(json.dumps({"response": "no prompt field"}) + "\n")
    out = d / "out"
    args = ["run", "--task", "sft", "--preset", "tiny", "--data", str(data), "--output", str(out),
            "--train-steps", "200", "--set", "train.seq_len=48",
            "--set", "model.max_position_embeddings=64"]
    # In a child process, whose memory is returned when it ends.
    result = subprocess.run(
        [sys.executable, "-c", f"from cli import main; raise SystemExit(main({args!r}))"],
        capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-5000:])
    return run_paths(str(out))


def _newest(store, type_name):
    return max(store.get_artifacts_by_type(type_name), key=lambda a: a.id)


def test_sft_run_is_pushed_and_answers_a_plain_prompt(sft_run, capsys):
    serving = pathlib.Path(sft_run["serving_model_dir"])
    pushed = sorted(serving.iterdir())[-1]
    affixes = json.loads((pushed / "assets.extra" / "chat_prompt.json").read_text())
    assert affixes["suffix"].endswith("Assistant: ")
    capsys.readouterr()
    prompt = "Before we proceed any further, hear me speak."
    assert cli.main(["generate", "--model", str(serving), "--prompt", prompt,
                     "--max-new-tokens", "12", "--seed", "1"]) == 0
    answer = capsys.readouterr().out
    assert answer.startswith(prompt) and len(answer.strip()) > len(prompt)
    assert cli.main(["generate", "--model", str(serving), "--prompt", prompt, "--raw",
                     "--max-new-tokens", "12", "--seed", "1"]) == 0
    print(f"\nanswer: {answer!r}\nraw:    {capsys.readouterr().out!r}")


def test_chat_with_the_sft_model_replies_as_its_generate_signature(sft_run):
    """`chat` wraps a prompt in the chat template as the exported `generate` signature
    does: a first reply is the signature's completion (greedy, and sampled with the
    model's defaults), streamed over the KV cache of the model rebuilt from the SavedModel."""
    import io

    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from serving.chat import ChatSession

    model_dir = cli.resolve_model_dir(sft_run["serving_model_dir"])
    generate = tf.saved_model.load(model_dir).signatures["generate"]
    session = ChatSession.from_dir(model_dir, max_new_tokens=12, seed=1)
    assert session.chat_prompt is not None
    defaults = session.sampling
    prompt = "Before we proceed any further, hear me speak."
    for knobs in (dict(temperature=0.0, top_k=0, top_p=1.0), {}):  # greedy, the defaults
        session.sampling = dataclasses.replace(defaults, **knobs)
        session.reset()
        out = io.StringIO()
        reply = session.reply(prompt, out)
        s = session.sampling
        expected = generate(prompt=tf.constant([prompt]), max_new_tokens=tf.constant([12]),
                            temperature=tf.constant([s.temperature]),
                            top_k=tf.constant([s.top_k]), top_p=tf.constant([s.top_p]),
                            seed=tf.constant([s.seed]))["completion"][0].numpy().decode("utf-8")
        assert out.getvalue() == reply == expected, knobs
    assert reply  # with the defaults and seed 1, an answer (as in the test above)


def test_sft_counts_records_and_scores_responses_only(sft_run):
    from reporting.run_summary import open_store

    store = open_store(sft_run["metadata_path"])
    model = _newest(store, "Model")
    props = {k: v.int_value for k, v in model.custom_properties.items()}
    assert props["sft_records_used"] + props["sft_rejected_too_long"] == props["sft_records"]
    assert props["sft_records_used"] > 0 and props["sft_response_tokens"] > 0
    evaluation = _newest(store, "ModelEvaluation").custom_properties
    assert evaluation["response_perplexity"].double_value > 1.0
    assert evaluation["response_bits_per_byte"].double_value == pytest.approx(
        evaluation["bits_per_byte"].double_value)
    # ExampleGen/TextCleaner counted the two bad records with their reasons.
    cleaned = [a for a in store.get_artifacts_by_type("Examples")
               if "records_read" in a.custom_properties][-1].custom_properties
    assert cleaned["dropped_empty_response"].int_value == 1
    assert cleaned["dropped_missing_prompt_field"].int_value == 1
