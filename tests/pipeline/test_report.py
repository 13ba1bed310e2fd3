"""The run report's helpers without a pipeline run: event files to series, the expert-load
heatmap data, the pipeline graph's columns, and a store without runs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from pipeline import report, report_data


def test_read_events_splits_scalars_from_tensors_and_sorts_by_step(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in (3, 1, 2):  # written out of order; step 2 twice (the later value wins)
            tf.summary.scalar("train/loss", 10.0 - step, step=step)
            tf.summary.write("moe/layer_1/expert_load", np.full(4, step, np.float32), step=step)
        tf.summary.scalar("train/loss", 99.0, step=2)
    writer.close()

    scalars, tensors = report_data.read_events(str(tmp_path))

    assert scalars == {"train/loss": ([1, 2, 3], [9.0, 99.0, 7.0])}
    steps, loads = tensors["moe/layer_1/expert_load"]
    assert steps == [1, 2, 3]
    np.testing.assert_array_equal(np.stack(loads), [[1] * 4, [2] * 4, [3] * 4])


def test_read_events_of_a_directory_without_events_is_unavailable(tmp_path):
    with pytest.raises(report_data.Unavailable, match="no TensorBoard event files"):
        report_data.read_events(str(tmp_path))


def test_expert_load_is_experts_by_windows_over_the_window_mean():
    tensors = {
        "moe/mtp_0/expert_load": ([5, 10], [np.array([1.0, 3.0]), np.array([0.0, 0.0])]),
        "moe/layer_1/expert_load": ([5, 10, 15], [np.array([2.0, 6.0, 4.0])] * 3),
        "router_bias/layer_1/min": ([5], [np.zeros(1)]),  # not a load: ignored
    }

    layers = report_data.expert_load(tensors)

    assert [(name, steps) for name, steps, _ in layers] == [("layer_1", [5, 10, 15]),
                                                          ("mtp_0", [5, 10])]
    # layer_1: mean (2 + 6 + 4) / 3 = 4 -> 0.5, 1.5, 1.0 in each of 3 windows: (3 experts, 3)
    np.testing.assert_allclose(layers[0][2], [[0.5] * 3, [1.5] * 3, [1.0] * 3])
    # mtp_0: window 1 mean 2 -> 0.5, 1.5; window 2 routed nothing -> 0, 0
    np.testing.assert_allclose(layers[1][2], [[0.5, 0.0], [1.5, 0.0]])


def _fake_store():
    config = metadata_store_pb2.ConnectionConfig()
    config.fake_database.SetInParent()
    return metadata_store.MetadataStore(config)


def test_pipeline_graph_puts_each_execution_one_column_after_its_last_producer():
    store = _fake_store()
    etype = store.put_execution_type(metadata_store_pb2.ExecutionType(name="E"))
    atype = store.put_artifact_type(metadata_store_pb2.ArtifactType(name="A"))
    # gen -> stats -> validator; gen -> cleaner; (stats, cleaner) -> transform
    names = ["gen", "stats", "validator", "cleaner", "transform"]
    ids = store.put_executions([metadata_store_pb2.Execution(type_id=etype) for _ in names])
    node = dict(zip(names, ids, strict=True))
    out = dict(zip(["gen", "stats", "cleaner"],
                   store.put_artifacts([metadata_store_pb2.Artifact(type_id=atype)] * 3),
                   strict=True))
    Event = metadata_store_pb2.Event  # noqa: N806
    edges = [("gen", "stats"), ("stats", "validator"), ("gen", "cleaner"),
             ("stats", "transform"), ("cleaner", "transform")]
    store.put_events([Event(artifact_id=out[a], execution_id=node[a], type=Event.OUTPUT)
                      for a in out]
                     + [Event(artifact_id=out[a], execution_id=node[b], type=Event.INPUT)
                        for a, b in edges])
    executions = [{"id": node[n], "component": n, "state": "COMPLETE", "duration_s": 1.0}
                  for n in names]

    columns = report_data.pipeline_graph(store, executions)

    assert [[e["component"] for e in col] for col in columns] == [
        ["gen"], ["stats", "cleaner"], ["validator", "transform"]]
    assert columns[2][1]["after"] == ["cleaner", "stats"]


def test_a_store_without_runs_gives_every_section_not_available(tmp_path):
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "metadata.db")
    metadata_store.MetadataStore(config)  # creates the (empty) store

    page = report.build_html(str(tmp_path))

    sections = page.split('<section id="')[1:]
    assert [s.split('"')[0] for s in sections] == list(report.SECTIONS)
    for section in sections:
        assert "not available:" in section
    assert "http://" not in page and "https://" not in page


def test_no_store_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ML Metadata store"):
        report.write_report(str(tmp_path))
    assert report.write_report_quietly(str(tmp_path)) is None  # one line, no exception


def test_a_failed_run_gets_its_report_attempted_and_its_error_kept(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="component failed"), \
            report.written_on_failure(str(tmp_path)):
        raise RuntimeError("component failed")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("report: not written (FileNotFoundError")
