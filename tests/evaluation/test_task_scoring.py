"""Benchmark task scoring (evaluation/task_scoring.py, task_models.py) on a tiny model:
the in-graph batched log-likelihoods against a row-by-row float64 reference, the harness's
tokenization and metrics, truncation, generation exact match, and a SavedModel and its
Keras model scoring the same."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation import task_scoring
from evaluation.tasks import (
    GENERATION,
    MULTIPLE_CHOICE,
    GenerationExample,
    MultipleChoiceExample,
    Task,
)

# Slow tier: the module's fixture exports a tiny text SavedModel (about 11 s on 2 cores).
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "Question": 8, "Answer": 8, ":": 9, "\n": 30, "床前": 6, "明月": 4, "。": 10, "，": 20}
VOCAB, CONTEXT = 300, 48


def _task(examples, kind=MULTIPLE_CHOICE, **kw) -> Task:
    fields = dict(name="t", type=kind, num_fewshot=0, target_delimiter=" ", fewshot_delimiter="\n\n",
                  description="", examples=tuple(examples), fewshot=(), source="", path="t.jsonl")
    return Task(**{**fields, **kw})


@pytest.fixture(scope="module")
def tokenizer():
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    return ByteLevelBpe(learn(UNITS, VOCAB).json)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    from tiny_text_model import save_tiny_text_model

    return save_tiny_text_model(tmp_path_factory.mktemp("tasks") / "saved", tokenizer,
                                context=CONTEXT, max_new_tokens=4, vocab_size=VOCAB, seed=5)


@pytest.fixture(scope="module")
def task_model(saved):
    from evaluation.task_models import from_saved_model

    return from_saved_model(str(saved))


MC = [MultipleChoiceExample("Question: the quick brown fox?\nAnswer:", ("jumps", "over the", "fox"), 1),
      MultipleChoiceExample("床前明月", ("光，", "霜。", "明月。"), 0),
      MultipleChoiceExample("the quick " * 30 + "brown", ("fox jumps over", "the"), 0)]


def _reference(logits_fn, row) -> float:
    """Row by row, float64 log_softmax in numpy: the server's arithmetic."""
    logits = logits_fn(np.array([row.input_ids], np.int32)).numpy()[0].astype(np.float64)
    total = 0.0
    for t in range(row.first_target, len(row.input_ids)):
        x = logits[t - 1] - logits[t - 1].max()
        total += x[row.input_ids[t]] - np.log(np.exp(x).sum())
    return total


def test_batched_in_graph_loglikelihoods_equal_row_by_row_float64(task_model):
    task = _task(MC)
    rows = task_scoring.choice_rows(task_model.tokenizer, task, CONTEXT, task_model.eos_id)
    assert len(rows) == 8 and all(r.input_ids[0] == task_model.eos_id for r in rows)
    lls, _ = task_scoring.score_rows(task_scoring.choice_scorer(task_model.logits_fn), rows,
                                     batch_size=3, pad_id=task_model.pad_id)
    expected = [_reference(task_model.logits_fn, r) for r in rows]
    np.testing.assert_allclose(lls, expected, atol=1e-4, rtol=0)
    assert all(ll < 0 for ll in lls)


def test_rows_follow_the_harness_encode_pair_and_truncate_on_the_left(task_model):
    tok = task_model.tokenizer
    context_ids, continuation_ids = task_scoring.encode_pair(tok, "Answer: ", "fox")
    # the trailing space moves to the continuation, which is whole[len(context):]
    assert context_ids == tok.encode("Answer:", add_special_tokens=False).ids
    assert tok.decode(continuation_ids) == " fox"
    rows = task_scoring.choice_rows(tok, _task(MC), CONTEXT, task_model.eos_id)
    long_rows = [r for r in rows if r.example == 2]
    assert all(len(r.input_ids) <= CONTEXT for r in long_rows)
    assert long_rows[0].truncated and not rows[0].truncated
    for r in rows:  # the continuation is the row's tail, decoded back to the choice
        choice = MC[r.example].choices[r.choice]
        assert tok.decode(list(r.input_ids[r.first_target:])) == " " + choice


def test_metrics_acc_norm_counts_characters_and_acc_bytes_bytes():
    examples = [MultipleChoiceExample("c", ("ab", "明月"), 0),
                MultipleChoiceExample("c", ("x", "y"), 1)]
    # choice 0: -3 over 2 chars/2 bytes; choice 1: -5 over 2 chars/6 bytes
    metrics = task_scoring.multiple_choice_metrics(_task(examples), [[-3.0, -5.0], [-1.0, -0.5]])
    assert metrics["acc"] == 1.0 and metrics["acc_norm"] == 1.0
    assert metrics["acc_bytes"] == 0.5  # per byte, 明月 (-5/6) beats ab (-3/2)
    assert metrics["chance"] == 0.5 and metrics["n"] == 2
    assert metrics["acc_bytes_stderr"] == pytest.approx(0.5)


def test_score_multiple_choice_reports_metrics_per_example_and_truncation(task_model):
    scored = task_scoring.score_multiple_choice(
        task_model.logits_fn, task_model.tokenizer, _task(MC), context_len=CONTEXT,
        batch_size=4, eos_id=task_model.eos_id, pad_id=task_model.pad_id)
    m = scored["metrics"]
    assert m["n"] == 3 and m["truncated"] == 1 and m["type"] == MULTIPLE_CHOICE
    assert [len(x) for x in scored["loglikelihoods"]] == [3, 3, 2]
    assert m["acc"] == np.mean([np.argmax(x) == e.label
                                for x, e in zip(scored["loglikelihoods"], MC, strict=True)])


def test_generation_exact_match_after_the_stop_strings():
    examples = [GenerationExample("q1", "明月光", ("\n",)), GenerationExample("q2", "fox", ("。",)),
                GenerationExample("q3", "yes", ())]
    calls = []

    def generate_fn(prompts, max_new_tokens):
        calls.append((list(prompts), max_new_tokens))
        return {"q1": [" 明月光\n疑是"], "q2": ["fox jumps。"], "q3": ["yes!"]}[prompts[0]]

    scored = task_scoring.score_generation(generate_fn, _task(examples, GENERATION),
                                           max_new_tokens=7, batch_size=1)
    assert scored["completions"] == [" 明月光", "fox jumps", "yes!"]
    assert scored["metrics"]["exact_match"] == pytest.approx(1 / 3)
    assert calls == [(["q1"], 7), (["q2"], 7), (["q3"], 7)]


def test_a_saved_model_and_its_keras_model_score_alike(saved, task_model, tokenizer):
    """The SavedModel's signatures and the Keras model (as a Hugging Face baseline is
    scored) give the same log-likelihoods and the same greedy completions."""
    from evaluation.task_models import from_keras_model, score_tasks
    from savedmodel.base_model import load_model

    mc = _task(MC)
    gen = _task([GenerationExample("the quick", "brown", ("\n",)),
                 GenerationExample("床前明月", "光", ())], GENERATION, name="g", max_gen_toks=3)
    a = score_tasks(task_model, [mc, gen], batch_size=4)
    keras_model = from_keras_model(load_model(str(saved)), tokenizer)
    b = score_tasks(keras_model, [mc, gen], batch_size=2)
    np.testing.assert_allclose(np.concatenate(a["samples"]["t"]["loglikelihoods"]),
                               np.concatenate(b["samples"]["t"]["loglikelihoods"]), atol=1e-4)
    assert a["samples"]["g"]["completions"] == b["samples"]["g"]["completions"]
    assert a["tasks"]["t"]["acc"] == b["tasks"]["t"]["acc"]
    json.dumps(a["tasks"])  # metrics.json takes them as they are


def test_generation_task_needs_a_generate_signature_and_names_must_differ(task_model):
    from evaluation.task_models import TaskModel, score_tasks

    no_generate = TaskModel(**{**task_model.__dict__, "generate_fn": None})
    with pytest.raises(ValueError, match="'g' is a generation task"):
        score_tasks(no_generate, [_task([GenerationExample("a", "b", ())], GENERATION, name="g")], 2)
    with pytest.raises(ValueError, match="name the task 't'"):
        score_tasks(task_model, [_task(MC), _task(MC)], 2)
