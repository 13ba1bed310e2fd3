"""Data mixtures (`components/trainer/mixture.py`): shares, determinism, tags, exhaustion.

Two real sources: Tiny Shakespeare (paragraphs, the first 200 KB) and the Tang/Song poems.
Token ids are UTF-8 bytes in disjoint ranges, no tokenizer needed: Shakespeare byte b is
id 3 + b, a poem's byte b is id 259 + b, so every token names its source ([EOS] is 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import data, mixture
from tokenization.tokenizer import EOS_ID

SEQ_LEN = 16
BATCH = 64
SHAKESPEARE_IDS = (3, 259)  # [low, high)
POEM_IDS = (259, 515)


def byte_ids(text: str, offset: int) -> list[int]:
    return [offset + b for b in text.encode("utf-8")]


@pytest.fixture(scope="module")
def sources(shakespeare, chinese_poems, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    paragraphs = [p for p in shakespeare[:200_000].split("\n\n") if p.strip()]
    files = {"poems": str(root / "poems.gz"), "shakespeare": str(root / "shakespeare.gz")}
    data.write_examples(files["shakespeare"], [byte_ids(p, SHAKESPEARE_IDS[0]) for p in paragraphs])
    data.write_examples(files["poems"], [byte_ids(p, POEM_IDS[0]) for p in chinese_poems])
    return files


def mixture_batches(sources, weights, n, batch=BATCH, seed=7, **kwargs):
    ds = mixture.make_mixture_train_dataset(sources, weights, SEQ_LEN, batch, 256, seed, **kwargs)
    return list(ds.take(n).as_numpy_iterator()) if n else list(ds.as_numpy_iterator())


def test_sources_are_indexed_by_name_and_weights_checked(sources):
    assert mixture.source_names({"b": 1, "a": 2}) == ["a", "b"]
    assert mixture.normalized_weights({"b": 1, "a": 2}, {"a": 1, "b": 3}) == [0.25, 0.75]
    with pytest.raises(ValueError, match="exactly one weight"):
        mixture.normalized_weights({"a": 1, "b": 2}, {"a": 1})
    with pytest.raises(ValueError, match="> 0"):
        mixture.normalized_weights({"a": 1}, {"a": 0.0})
    with pytest.raises(ValueError, match="on_exhausted"):
        mixture.make_mixture_train_dataset(sources, {"poems": 1, "shakespeare": 1}, SEQ_LEN,
                                           BATCH, 16, 0, on_exhausted="cycle")


# N = 10,240 sequences (160 batches of 64): the binomial std sqrt(p(1-p)/N) is 0.30 points
# at p = 0.1 and 0.49 points at p = 0.5, both under 0.5; the bound is 2 points.
N_BATCHES = 160


@pytest.mark.parametrize("weights", [{"shakespeare": 9, "poems": 1},
                                     {"shakespeare": 1, "poems": 1}])
def test_realized_shares_follow_the_weights_and_windows_carry_their_source(sources, weights):
    counter = mixture.SourceTokenCounter(mixture.source_names(sources))
    in_graph = np.zeros(2, np.int64)
    ranges = [POEM_IDS, SHAKESPEARE_IDS]  # source_names order: poems, shakespeare
    for batch in mixture_batches(sources, weights, N_BATCHES):
        counter.add(batch)
        in_graph += mixture.tokens_by_source(batch["source"], batch["labels"], 2).numpy()
        for ids, source in zip(batch["input_ids"], batch["source"], strict=True):
            low, high = ranges[source]
            text = ids[ids != EOS_ID]
            assert ((text >= low) & (text < high)).all(), f"a window of source {source} mixes"
    assert counter.sequences.sum() == N_BATCHES * BATCH
    assert counter.tokens.sum() == N_BATCHES * BATCH * SEQ_LEN
    np.testing.assert_array_equal(in_graph, counter.tokens)
    shares = counter.shares()
    total = sum(weights.values())
    for name, w in weights.items():
        assert abs(shares[name] - w / total) < 0.02, (name, shares)


def test_same_seed_same_batches_and_skipping_resumes_the_stream(sources):
    weights = {"shakespeare": 3, "poems": 1}
    first = mixture_batches(sources, weights, 12, batch=8)
    again = mixture_batches(sources, weights, 12, batch=8)
    ds = mixture.make_mixture_train_dataset(sources, weights, SEQ_LEN, 8, 256, 7)
    resumed = list(ds.skip(5).take(7).as_numpy_iterator())
    for a, b in zip(first, again, strict=True):
        for key in ("input_ids", "labels", "source"):
            np.testing.assert_array_equal(a[key], b[key])
    for a, b in zip(first[5:], resumed, strict=True):
        for key in ("input_ids", "labels", "source"):
            np.testing.assert_array_equal(a[key], b[key])
    other = mixture_batches(sources, weights, 12, batch=8, seed=8)
    assert any((a["input_ids"] != b["input_ids"]).any() for a, b in zip(first, other, strict=True))


def test_replicas_split_the_source_with_their_rows(sources):
    def dataset():  # a fresh one, as each input pipeline builds (re-iterating reshuffles)
        return mixture.make_mixture_train_dataset(sources, {"shakespeare": 1, "poems": 1},
                                                  SEQ_LEN, 8, 64, 3).take(3)

    whole = list(dataset().as_numpy_iterator())
    parts = list(data.split_for_replicas(dataset(), 2, 2).as_numpy_iterator())  # k=R=b=2
    for g, batch in enumerate(whole):
        r0, r1 = parts[2 * g], parts[2 * g + 1]
        for key in ("input_ids", "source"):
            rows = np.concatenate([np.concatenate([r0[key][m], r1[key][m]]) for m in range(2)])
            np.testing.assert_array_equal(rows, batch[key])


def test_one_source_is_exactly_make_train_dataset(sources):
    path = sources["poems"]
    mixed = mixture.make_mixture_train_dataset({"poems": path}, {"poems": 2.5}, SEQ_LEN, 8, 64, 5)
    plain = data.make_train_dataset(path, SEQ_LEN, 8, 64, 5)
    n = 0
    for a, b in zip(mixed.take(40).as_numpy_iterator(), plain.take(40).as_numpy_iterator(),
                    strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert (a["source"] == 0).all()
        n += 1
    assert n == 40


@pytest.fixture(scope="module")
def small_and_large(tmp_path_factory):
    """Source "a": 6 documents (201 stream tokens: 11 windows of 17); "b": 300 documents."""
    root = tmp_path_factory.mktemp("exhaust")
    files = {"a": str(root / "a.gz"), "b": str(root / "b.gz")}
    data.write_examples(files["a"], [[10 + d] * (30 + d) for d in range(6)])
    data.write_examples(files["b"], [[100 + d % 50] * 20 for d in range(300)])
    return files


def test_stop_ends_the_mixture_when_a_source_runs_out(small_and_large):
    sizes = mixture.measure_sources(small_and_large)
    assert sizes["a"] == mixture.SourceSize(documents=6, tokens=sum(31 + d for d in range(6)))
    windows_a = (1 + sizes["a"].tokens) // (SEQ_LEN + 1)  # the stream starts with [EOS]
    windows_b = (1 + sizes["b"].tokens) // (SEQ_LEN + 1)
    weights = {"a": 1, "b": 1}
    drawn = mixture_batches(small_and_large, weights, None, batch=1, on_exhausted="stop")
    counts = np.bincount(np.concatenate([b["source"] for b in drawn]), minlength=2)
    assert counts[0] == windows_a  # every window of "a" was drawn, then the stream ended
    assert 0 < counts[1] < windows_b  # "b" still had windows
    batched = mixture_batches(small_and_large, weights, None, batch=4, on_exhausted="stop")
    assert len(batched) == len(drawn) // 4  # the same draws; the partial batch is dropped
    epochs = mixture.epochs_drawn({"a": int(counts[0]), "b": int(counts[1])}, sizes, SEQ_LEN)
    assert epochs["a"] == pytest.approx(windows_a * (SEQ_LEN + 1) / sizes["a"].tokens)
    assert epochs["b"] < 1


def test_repeat_up_samples_a_source_that_runs_out(small_and_large):
    sizes = mixture.measure_sources(small_and_large)
    n = 200  # 200 sequences at 1:1: "a" gives about 100, more than 7 epochs of it
    drawn = mixture_batches(small_and_large, {"a": 1, "b": 1}, n, batch=1)
    assert len(drawn) == n
    counts = np.bincount(np.concatenate([b["source"] for b in drawn]), minlength=2)
    epochs = mixture.epochs_drawn({"a": int(counts[0]), "b": int(counts[1])}, sizes, SEQ_LEN)
    assert epochs["a"] > 5


def test_realized_shares_and_counter_arithmetic():
    assert mixture.realized_shares({"a": 30, "b": 10}) == {"a": 0.75, "b": 0.25}
    assert mixture.realized_shares({"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}
    counter = mixture.SourceTokenCounter(["a", "b"])
    labels = np.full((2, 3, 4), 5, np.int32)  # (k, b, T)
    labels[0, 0, :2] = data.IGNORE_LABEL
    source = np.array([[0, 1, 1], [0, 0, 0]], np.int32)
    counter.add({"source": source, "labels": labels})
    assert counter.counts() == {"a": 2 + 12, "b": 8}
    np.testing.assert_array_equal(
        mixture.tokens_by_source(tf.constant(source), tf.constant(labels), 2).numpy(), [14, 8])
    counter.add_counts([1, 1])
    assert counter.counts() == {"a": 15, "b": 9}


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_sources_of_one_split_are_its_records_of_each_source_name(sources, tmp_path):
    """Transform writes every source into one split: filtering it by `source_name` gives
    each source's own documents and the same stream as separate files; examples without
    the feature are source "default"; a source with no record is named in the error."""
    docs = {name: [ids.tolist() for ids in data.read_documents(path).as_numpy_iterator()]
            for name, path in sources.items()}
    merged = str(tmp_path / "train-00000-of-00001.gz")
    split_file(merged, [(name, docs[name]) for name in sorted(docs)])
    split = mixture.split_sources(merged, sorted(docs))
    for name in docs:
        got = [ids.tolist() for ids in mixture.read_source(split[name]).as_numpy_iterator()]
        assert got == docs[name]
    assert mixture.measure_sources(split) == mixture.measure_sources(sources)
    weights = {"shakespeare": 9, "poems": 1}
    own = mixture.make_mixture_train_dataset(sources, weights, SEQ_LEN, 8, 64, 3).take(20)
    one = mixture.make_mixture_train_dataset(split, weights, SEQ_LEN, 8, 64, 3).take(20)
    for x, y in zip(own.as_numpy_iterator(), one.as_numpy_iterator(), strict=True):
        for key in ("input_ids", "labels", "source"):
            np.testing.assert_array_equal(x[key], y[key])
    assert sum(1 for _ in data.read_documents(merged, "default")) == 0
    old = str(tmp_path / "old.gz")
    data.write_examples(old, [[5, 6, 7]])  # written before source_name existed
    assert [d.tolist() for d in data.read_documents(old, "default").as_numpy_iterator()] == [
        [5, 6, 7]]
    with pytest.raises(ValueError, match="source 'web' has no document.*'web'"):
        mixture.measure_sources(mixture.split_sources(merged, ["web"]))


def split_file(path, parts) -> None:
    """One transformed split holding several sources: (source_name, documents) pairs."""
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for name, documents in parts:
            for ids in documents:
                example = tf.train.Example(features=tf.train.Features(feature={
                    "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "num_bytes": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[len(ids)])),
                    "source_name": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[name.encode()]))}))
                writer.write(example.SerializeToString())


def mixture_config(weights=(("b", 1), ("a", 3)), **train):
    from config import get_config

    return get_config("tiny", {
        "data.sources": [{"name": n, "path": f"/{n}", "weight": w} for n, w in weights],
        "train.train_steps": 6, "train.log_every": 1, "train.checkpoint_every": 3,
        "train.warmup_steps": 2, **{f"train.{k}": v for k, v in train.items()}})


@pytest.mark.slow  # trains the tiny preset several times
def test_a_mixture_trains_and_resumes_on_the_batches_of_an_uninterrupted_run(tmp_path,
                                                                            make_documents):
    """The Trainer's stream for 2 sources (`job.make_dataset_fn`: the mixture of one split's
    records by `source_name`) trains, counts tokens per source on the global batch, and a
    run killed after its step-3 checkpoint, resumed, trains on the batches of an
    uninterrupted run with the same per-source totals (checkpointed)."""
    from components.trainer import job as job_lib
    from components.trainer import train_loop

    path = str(tmp_path / "train-00000-of-00001.gz")
    split_file(path, [("a", make_documents(seed=0)), ("b", make_documents(n_docs=60, seed=1))])
    config = mixture_config()
    tc = config.train

    def run(workdir, take=None):
        full = job_lib.make_dataset_fn(config, [path], EOS_ID, 2)

        def dataset_fn():
            return full().take(take) if take else full()

        return train_loop.train(config, dataset_fn, str(workdir / "ckpt"), str(workdir / "logs"))

    reference = run(tmp_path / "reference")
    assert reference.source_weights == {"a": 0.75, "b": 0.25}
    total = tc.train_steps * tc.batch_size * tc.seq_len  # 6 x 8 x 32 = 1,536 tokens
    assert sum(reference.source_tokens.values()) == total
    assert sum(reference.source_sequences.values()) == tc.train_steps * tc.batch_size
    assert reference.source_tokens["a"] > reference.source_tokens["b"] > 0
    assert reference.history[-1]["source_tokens"] == reference.source_tokens
    # The counts are the batches' own: the stream's first 6 batches, counted on the host.
    counter = mixture.SourceTokenCounter(["a", "b"])
    for batch in job_lib.make_dataset_fn(config, [path], EOS_ID, 2)().take(6):
        counter.add(batch)
    assert counter.counts() == reference.source_tokens
    with pytest.raises((tf.errors.OutOfRangeError, StopIteration)):
        run(tmp_path / "killed", take=4)  # checkpoint at 3, no batch for step 5
    resumed = run(tmp_path / "killed")
    assert resumed.resumed_from_step == 3 and resumed.steps_run == 3
    # The history is the whole run's: steps 1-3 come back with the checkpoint.
    assert [h["step"] for h in resumed.history] == [h["step"] for h in reference.history]
    np.testing.assert_allclose([h["loss"] for h in resumed.history],
                               [h["loss"] for h in reference.history], rtol=1e-6)
    assert resumed.source_tokens == reference.source_tokens
    assert resumed.source_sequences == reference.source_sequences
    assert resumed.source_token_shares == reference.source_token_shares


@pytest.mark.slow  # trains the tiny preset several times
def test_stop_ends_training_at_the_last_full_batch_with_a_checkpoint(tmp_path, make_documents):
    """train.on_source_exhausted=stop: source "a" (12 windows of 33 tokens) runs out at 1:1
    after ~24 sequences, so 10 steps of 8 stop at step ~3: checkpointed there, the figures
    say which source and where, and a re-run resumes there and trains nothing more."""
    from components.trainer import job as job_lib

    path = str(tmp_path / "train-00000-of-00001.gz")
    small = [[10 + d] * 40 for d in range(10)]  # 10 x (40 + 1 EOS) + 1 = 411 -> 12 windows
    split_file(path, [("a", small), ("b", make_documents(n_docs=300, seed=2))])
    config = mixture_config((("a", 1), ("b", 1)), train_steps=10, checkpoint_every=100,
                            on_source_exhausted="stop")

    def run():
        job = job_lib.TrainingJob(
            pipeline_config=config.to_json(), train_files=[path],
            checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "logs"),
            result_path=str(tmp_path / "result.json"), peak_flops_per_device=1e11)
        job_lib.run(job)
        with open(job.result_path) as f:
            return json.load(f)

    first = run()
    step = first["train_steps"]
    assert 0 < step < 10, first["stopped_early"]
    assert first["stopped_early"] == f"source 'a' exhausted at step {step}"
    assert first["last_checkpoint"].endswith(f"ckpt-{step}")
    assert first["tokens_seen"] == step * 8 * 32
    windows_a = (1 + 10 * 41) // 33  # 12
    drawn_a = first["source_sequences"]["a"]
    assert windows_a - 8 < drawn_a <= windows_a  # all but a dropped partial batch
    assert first["source_epochs"]["a"] == pytest.approx(drawn_a * 33 / (10 * 41))
    assert 0 < first["source_epochs"]["b"] < 1
    again = run()
    assert again["resumed_from_step"] == step and again["steps_run"] == 0
    assert again["source_tokens"] == first["source_tokens"]


def test_the_trainer_samples_by_weight_only_for_pretraining_mixtures():
    from components.trainer import job as job_lib
    from config import get_config

    assert not job_lib.is_mixture(get_config("tiny"))  # one source: today's stream
    assert job_lib.is_mixture(mixture_config())
    assert job_lib.is_mixture(get_config("tiny", {"train.on_source_exhausted": "stop"}))
    job_lib.check_mixture(get_config("tiny", {"data.task": "sft"}))
    sft = get_config("tiny", {"data.task": "sft", "data.sources": [
        {"name": "chat", "path": "/c"}, {"name": "code", "path": "/d", "weight": 2}]})
    with pytest.raises(ValueError, match=r"data.task=sft with data.sources \['chat', 'code'\]"):
        job_lib.check_mixture(sft)
    with pytest.raises(ValueError, match="data.sources"):
        job_lib.make_dataset_fn(sft, ["/none"], EOS_ID, 2)


@pytest.mark.slow  # imports tfx
def test_the_model_artifact_records_the_mixture_as_json():
    from components.trainer.executor import record_summary

    class Artifact:
        def __init__(self):
            self.properties = {}

        def set_string_custom_property(self, key, value):
            self.properties[key] = value

        set_int_custom_property = set_float_custom_property = set_string_custom_property
        set_bool_custom_property = set_string_custom_property

    artifact = Artifact()
    record_summary(artifact, {
        "source_weights": {"web": 0.9, "poems": 0.1}, "source_tokens": {"web": 90, "poems": 10},
        "source_token_shares": {"web": 0.9, "poems": 0.1},
        "source_epochs": {"web": 0.5, "poems": 2.0}, "source_sequences": {"web": 3},
        "stopped_early": "source 'poems' exhausted at step 7"})
    assert json.loads(artifact.properties["source_weights"]) == {"poems": 0.1, "web": 0.9}
    assert json.loads(artifact.properties["source_tokens"]) == {"poems": 10, "web": 90}
    assert json.loads(artifact.properties["source_token_shares"])["web"] == 0.9
    assert json.loads(artifact.properties["source_epochs"]) == {"poems": 2.0, "web": 0.5}
    assert artifact.properties["stopped_early"] == "source 'poems' exhausted at step 7"
    assert "source_sequences" not in artifact.properties


@pytest.mark.slow  # builds and traces the tiny model
def test_a_source_without_records_is_named(tmp_path, make_documents):
    from components.trainer import job as job_lib

    path = str(tmp_path / "train-00000-of-00001.gz")
    split_file(path, [("a", make_documents(n_docs=40, seed=0))])  # no record of "b"
    job = job_lib.TrainingJob(
        pipeline_config=mixture_config().to_json(), train_files=[path],
        checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "logs"),
        result_path=str(tmp_path / "result.json"), peak_flops_per_device=1e11)
    with pytest.raises(ValueError, match=r"data sources \['b'\] have no record"):
        job_lib.run(job)
