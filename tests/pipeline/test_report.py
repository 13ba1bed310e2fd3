"""The run report's helpers without a pipeline run: event files to series, the expert-load
heatmap data, the pipeline graph's columns, and a store without runs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from reporting import report, report_data


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


# ----------------------------------------------------------------------------- any language


def test_samples_are_shown_byte_exact_and_escaped_in_any_language():
    samples = [("床前明月光，", "疑是地上霜。\n<b>举头</b> & 望明月"),
               ("Tom & <Jerry> ", "said \"hi\"")]

    html = report.samples_html("/models/唐诗/1", samples)

    assert "/models/唐诗/1" in html
    assert '<span class="prompt">床前明月光，</span>' in html
    assert ('疑是地上霜。<span class="nl">↵</span> &lt;b&gt;举头&lt;/b&gt; &amp; 望明月'
            in html)
    assert '<span class="prompt">Tom &amp; &lt;Jerry&gt; </span>said &quot;hi&quot;' in html
    assert "<b>" not in html and "<Jerry>" not in html


def test_lineage_shows_chinese_file_names_exactly_and_escapes_them():
    data = {
        "model": {"type": "PushedModel"},
        "steps": [
            {"execution": {"component": "Pusher", "id": 9, "state": "COMPLETE"},
             "inputs": [{"type": "Model", "uri": "/runs/模型<1>&"}]},
            {"execution": {"component": "TextExampleGen", "id": 1, "state": "COMPLETE",
                           "input_base": "/数据/诗集", "input_fingerprint": "fp"},
             "inputs": []},
        ],
        "input_files": [{"path": "唐诗.txt", "bytes": 12, "sha256": "ab12"},
                        {"path": "a<b>&c.txt", "bytes": 1, "sha256": "cd34"}],
    }

    html = report.lineage_html("/服务/1", data)

    assert "PushedModel /服务/1, back to the input files" in html
    assert "<td>Model /runs/模型&lt;1&gt;&amp;</td>" in html
    assert "<td>read /数据/诗集 (fp)</td>" in html
    assert "<td>ab12</td><td>12</td><td>唐诗.txt</td>" in html
    assert "<td>a&lt;b&gt;&amp;c.txt</td>" in html


def test_report_is_utf8_with_its_charset_declared_first(tmp_path):
    out = tmp_path / "运行 <1>"  # the output directory's name is shown in the header
    out.mkdir()
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(out / "metadata.db")
    metadata_store.MetadataStore(config)

    with open(report.write_report(str(out)), "rb") as f:
        data = f.read()

    page = data.decode("utf-8")  # strict: any other encoding fails here
    assert '<meta charset="utf-8">' in data[:1024].decode("utf-8", "ignore")  # HTML's rule
    assert f"{str(out).replace('<', '&lt;').replace('>', '&gt;')} · run none recorded" in page


def test_generated_bytes_cut_inside_a_character_lose_only_that_character():
    text = "床前明月光".encode()
    assert report_data.decode_generated(text) == "床前明月光"
    assert report_data.decode_generated(text[:-1]) == "床前明月"  # 3-byte 光 cut after 2
    assert report_data.decode_generated(b"ok\xffok") == "ok\ufffdok"


def test_figures_with_chinese_or_dollar_in_names_neither_raise_nor_warn(recwarn):
    from reporting import report_plots

    matrix = np.ones((2, 3))
    series = {"min": ([1, 2], [0.0, -1.0]), "max": ([1, 2], [1.0, 2.0]),
              "mean_abs": ([1, 2], [0.5, 0.7])}
    names = ["专家层_1", "cost $\\frac$ x"]  # a CJK name; a "$" that is no valid mathtext

    html = (report_plots.expert_load_heatmaps([(n, [1, 2, 3], matrix) for n in names])
            + report_plots.router_bias([(n, series) for n in names])
            + report_plots.training_curves([("损失", {"模型": ([1, 2], [2.0, 1.0])})])
            + report_plots.bits_per_byte({"候选": 1.2}, 2.0))

    assert html.count('<img alt="') == 4
    assert [str(w.message) for w in recwarn] == []
