"""Replay when continuing (`pipeline/replay.py`): the replayed share, the lineage walk in
ML Metadata (an in-memory store built here), and the refusals. The pipeline run that
replays for real is in tests/e2e/test_warm_start_e2e.py."""

from __future__ import annotations

import hashlib
import json

import pytest
from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2 as pb

from config import DataSource, get_config, parse_set
from pipeline import replay


def _config(*sets):
    return get_config("tiny", parse_set(list(sets)))


def test_replay_takes_its_fraction_of_the_weights_of_a_one_source_run():
    config = replay.with_replay(_config("data.replay_fraction=0.2"),
                                (DataSource("replay", "/old/shakespeare.txt"),), "/new/poems.txt")
    assert [s.name for s in config.data.sources] == ["default", "replay"]
    assert config.data.sources[0].path == "/new/poems.txt"
    assert config.data.source_weights() == pytest.approx({"default": 0.8, "replay": 0.2})


def test_replay_of_a_mixture_keeps_the_base_runs_proportions_and_settings():
    config = _config("data.replay_fraction=0.25", 'data.sources=[{"name": "web", "path": "/w", '
                     '"weight": 7}, {"name": "code", "path": "/c", "weight": 3}]')
    old = (DataSource("en", "/en", 9.0), DataSource("zh", "/zh.jsonl", 1.0,
                                                      jsonl_text_field="content", min_chars=1))
    config = replay.with_replay(config, old, "/unused")
    weights = config.data.source_weights()
    assert weights == pytest.approx({"web": 0.525, "code": 0.225, "replay_en": 0.225,
                                     "replay_zh": 0.025})
    zh = config.data.for_source("replay_zh")
    # Its own text field is kept; min_chars equal to this run's is not repeated.
    assert zh.jsonl_text_field == "content"
    assert config.data.sources[-1].settings() == {"jsonl_text_field": "content"}


@pytest.mark.parametrize("sets, message", [
    ((), "data.replay_fraction > 0"),
    (("data.replay_fraction=0.2", 'data.sources=[{"name": "replay", "path": "/r"}]'),
     "already has a source named 'replay'"),
])
def test_replay_refusals(sets, message):
    with pytest.raises(replay.ReplayError, match=message):
        replay.with_replay(_config(*sets), (DataSource("replay", "/old"),), "/new")


# ------------------------------------------------------------------ lineage in ML Metadata


def _fake_store():
    config = pb.ConnectionConfig()
    config.fake_database.SetInParent()
    return metadata_store.MetadataStore(config)


def _type(store, name, kind="artifact"):
    if kind == "artifact":
        return store.put_artifact_type(pb.ArtifactType(name=name))
    return store.put_execution_type(pb.ExecutionType(name=name))


def _execution(store, type_id, inputs, outputs, **props):
    execution = pb.Execution(type_id=type_id)
    for key, value in props.items():
        execution.custom_properties[key].string_value = value
    events = [(pb.Event(type=pb.Event.INPUT), a) for a in inputs] + [
        (pb.Event(type=pb.Event.OUTPUT), a) for a in outputs]
    for event, artifact in events:
        event.artifact_id = artifact
    [execution_id] = store.put_executions([execution])
    store.put_events([pb.Event(type=e.type, artifact_id=e.artifact_id,
                               execution_id=execution_id) for e, _ in events])
    return execution_id


def _lineage_store(tmp_path, corpus_text: str):
    """ExampleGen -> Examples -> Transform -> Examples -> Trainer -> Model -> Pusher ->
    PushedModel, as TFX records them, over a real corpus file and a real model config."""
    from savedmodel.layout import extra_path

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "poems.txt").write_text(corpus_text, encoding="utf-8")
    model_uri = tmp_path / "Trainer" / "model" / "7"
    config = _config("data.min_chars=5")
    config_path = extra_path(str(model_uri / "Format-Serving"), "deepseek_tfx_config.json")
    import os

    os.makedirs(os.path.dirname(config_path))
    (model_uri / "Format-Serving" / "saved_model.pb").write_bytes(b"")
    with open(config_path, "w") as f:
        f.write(config.to_json())
    store = _fake_store()
    examples_t, model_t, pushed_t = (_type(store, n) for n in ("Examples", "Model", "PushedModel"))
    gen_t, transform_t, trainer_t, pusher_t = (_type(store, n, "execution") for n in (
        "ExampleGen", "Transform", "Trainer", "Pusher"))
    raw = pb.Artifact(type_id=examples_t, uri=str(tmp_path / "ExampleGen" / "examples" / "1"))
    raw.custom_properties["input_files"].string_value = json.dumps([{
        "path": "poems.txt", "bytes": len(corpus_text.encode()),
        "sha256": hashlib.sha256(corpus_text.encode()).hexdigest()}])
    transformed = pb.Artifact(type_id=examples_t, uri=str(tmp_path / "Transform" / "4"))
    model = pb.Artifact(type_id=model_t, uri=str(model_uri))
    pushed = pb.Artifact(type_id=pushed_t, uri=str(tmp_path / "Pusher" / "9"))
    pushed.custom_properties["pushed_destination"].string_value = str(tmp_path / "serving" / "17")
    raw_id, transformed_id, model_id, pushed_id = store.put_artifacts(
        [raw, transformed, model, pushed])
    _execution(store, gen_t, [], [raw_id], input_base=str(corpus),
               input_config=json.dumps({"splits": [{"name": "all", "pattern": "*.txt"}]}))
    _execution(store, transform_t, [raw_id], [transformed_id])
    _execution(store, trainer_t, [transformed_id], [model_id])
    _execution(store, pusher_t, [model_id], [pushed_id])
    return store, {"raw": raw_id, "model": model_id, "corpus": corpus,
                   "pushed": tmp_path / "serving" / "17", "model_uri": model_uri}


def test_the_base_models_data_is_found_through_lineage_from_its_pushed_directory(
        tmp_path, chinese_poems):
    text = "\n\n".join(chinese_poems[:20])
    store, ids = _lineage_store(tmp_path, text)
    for base in (str(ids["pushed"]), str(ids["model_uri"]),
                 str(ids["model_uri"] / "Format-Serving")):
        origin = replay.replay_origin(store, base)
        assert (origin.base_model_id, origin.examples_id) == (ids["model"], ids["raw"])
        (source,) = origin.sources
        assert source.name == "replay" and source.path == str(ids["corpus"] / "*.txt")
        assert source.min_chars == 5  # the base run's own setting
    replay.check_unchanged(origin)
    (ids["corpus"] / "poems.txt").write_text(text + "改", encoding="utf-8")
    with pytest.raises(replay.ReplayError, match="poems.txt changed since the base model"):
        replay.check_unchanged(origin)
    (ids["corpus"] / "poems.txt").unlink()
    with pytest.raises(replay.ReplayError, match="poems.txt, which the base model was "
                       "trained on, is gone"):
        replay.check_unchanged(origin)


def test_a_base_model_without_lineage_is_refused_with_the_reason(tmp_path, chinese_poems):
    store, _ = _lineage_store(tmp_path, "\n\n".join(chinese_poems[:3]))
    with pytest.raises(replay.ReplayError, match="has no lineage in this ML Metadata store.*"
                       "--replay-data PATH"):
        replay.replay_origin(store, str(tmp_path / "hf" / "DeepSeek-V2-Lite"))
    with pytest.raises(replay.ReplayError, match="no ML Metadata at"):
        replay.open_store(str(tmp_path / "nothing.db"))


def test_replay_data_names_the_old_data_of_a_base_without_lineage(tmp_path, chinese_poems,
                                                                   capsys):
    """`--replay-data PATH` (e.g. beside a Hugging Face base model): the old data is that
    path, checked and made absolute, as the source "replay"; no ML Metadata is read."""
    import argparse

    from cli.settings import replay as cli_replay

    old = tmp_path / "old" / "poems.txt"
    old.parent.mkdir()
    old.write_text("\n\n".join(chinese_poems[:10]), encoding="utf-8")
    args = argparse.Namespace(replay_data=str(old))
    config, lineage = cli_replay(args, _config("data.replay_fraction=0.2"), "/models/hf_base",
                                 "/new/*.txt", str(tmp_path / "no_store_here"))
    assert lineage is None
    assert [(s.name, s.path) for s in config.data.sources] == [
        ("default", "/new/*.txt"), ("replay", str(old))]
    assert config.data.source_weights() == pytest.approx({"default": 0.8, "replay": 0.2})
    assert "replay: 20% of the tokens from --replay-data" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--replay-data needs data.replay_fraction > 0"):
        cli_replay(args, _config(), "/models/hf_base", "/new/*.txt", str(tmp_path))
    with pytest.raises(SystemExit, match="source 'replay': --data '.*missing.txt': no such"):
        cli_replay(argparse.Namespace(replay_data=str(tmp_path / "missing.txt")),
                   _config("data.replay_fraction=0.2"), "/models/hf_base", "/new/*.txt",
                   str(tmp_path))
