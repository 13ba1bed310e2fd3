"""Named data sources with weights (issue 28, item 1's front door): `data.sources` in the
config (config/sources.py) and `deepseek-tfx run --data NAME=PATH --weight NAME=W
--source-set NAME.FIELD=VALUE` (cli/data.py). No TensorFlow, no TFX."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import config as configs
from config import DataSource, parse_sources, split_source_arg

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
MIX = [{"name": "web", "path": "/corpora/web", "weight": 7},
       {"name": "domain", "path": "gs://bucket/domain/*.jsonl", "weight": 2,
        "jsonl_text_field": "body"},
       {"name": "own", "path": "own.txt", "weight": 1, "min_chars": 20}]


def _mix(sources=None):
    return configs.get_config("tiny", {"data.sources": MIX if sources is None else sources})


# -- the config ---------------------------------------------------------------------------

def test_sources_round_trip_through_json_and_weights_normalize():
    config = _mix()
    assert [s.name for s in config.data.sources] == ["web", "domain", "own"]
    assert configs.PipelineConfig.from_json(config.to_json()) == config
    # 7:2:1 -> 0.7, 0.2, 0.1
    weights = config.data.source_weights()
    assert list(weights) == ["web", "domain", "own"]
    assert [round(w, 12) for w in weights.values()] == [0.7, 0.2, 0.1]
    assert math.fsum(weights.values()) == 1.0
    # the dict form is plain JSON: every setting a source leaves to the mixture is null
    d = json.loads(config.to_json())["data"]["sources"][1]
    assert d["name"] == "domain" and d["weight"] == 2.0 and d["jsonl_text_field"] == "body"
    assert d["min_chars"] is None


def test_a_source_sees_its_own_settings_and_the_mixtures_others():
    data = _mix().data
    domain = data.for_source("domain")
    assert domain.jsonl_text_field == "body" and domain.sources == ()
    assert domain.min_chars == data.min_chars and domain.near_dedup == data.near_dedup
    assert data.for_source("own").min_chars == 20
    assert data.for_source("web") == data.without_weights().for_source("web")
    with pytest.raises(KeyError, match="no data source 'wiki'"):
        data.for_source("wiki")
    # re-weighting changes nothing the components before the Trainer see
    reweighted = _mix([{**s, "weight": 1 + i} for i, s in enumerate(MIX)]).data
    assert reweighted != data and reweighted.without_weights() == data.without_weights()


def test_without_sources_there_is_one_source_named_default():
    data = configs.get_config("tiny").data
    assert data.sources == () and data.source_weights() == {"default": 1.0}
    assert data.for_source("default") is data
    assert configs.normalized_weights(()) == {"default": 1.0}


def test_a_pushed_models_config_from_before_sources_loads_unchanged():
    """`assets.extra/deepseek_tfx_config.json` of a model pushed on 2026-11-25 (no
    `data.sources`, nor `eval.tasks`): it loads, as one source named "default"."""
    text = (FIXTURES / "pushed_2026-11-25.json").read_text()
    assert "sources" not in json.loads(text)["data"]
    config = configs.PipelineConfig.from_json(text)
    assert config.data.sources == () and config.data.source_weights() == {"default": 1.0}
    old = json.loads(text)
    again = json.loads(config.to_json())
    assert again["data"] == {**old["data"], "sources": [], "replay_fraction": 0.0,
                             # issue 29's DPO/GRPO record fields, at their defaults
                             "chosen_field": "chosen", "rejected_field": "rejected",
                             "answer_field": "answer"}
    assert again["model"] == {**again["model"], **old["model"]}


@pytest.mark.parametrize("sources, message", [
    ([], None),  # no sources: the one-source case
    ([{"name": "Web", "path": "x"}], r"data.sources\[0\].name='Web': a source name must match"),
    ([{"name": "we-b", "path": "x"}], r"data.sources\[0\].name='we-b'"),
    ([{"name": "", "path": "x"}], r"data.sources\[0\].name=''"),
    ([{"name": "web", "path": ""}], r"data.sources.web.path='': must be a non-empty path"),
    ([{"name": "web", "path": "  "}], r"data.sources.web.path='  '"),
    ([{"name": "web"}], r"data.sources.web: no 'path'"),
    ([{"path": "x"}], r"data.sources\[0\]: no 'name'"),
    ([{"name": "web", "path": "a"}, {"name": "web", "path": "b"}],
     r"data.sources: the source name 'web' is given twice"),
    ([{"name": "web", "path": "a", "weight": 0}], r"data.sources.web.weight=0: a weight must"),
    ([{"name": "web", "path": "a", "weight": -1.5}], r"data.sources.web.weight=-1.5"),
    ([{"name": "web", "path": "a", "weight": "inf"}], r"data.sources.web.weight='inf'"),
    ([{"name": "web", "path": "a", "weight": float("nan")}], r"data.sources.web.weight=nan"),
    ([{"name": "web", "path": "a", "weight": True}], r"data.sources.web.weight=True"),
    ([{"name": "web", "path": "a", "weight": 10**400}], r"data.sources.web.weight=1000"),
    ([{"name": "web", "path": "a", "weight": 1e308}, {"name": "x", "path": "b", "weight": 1e308}],
     r"data.sources: the weights' sum overflows"),
    ([{"name": "web", "path": "a", "text_field": "x"}],
     r"data.sources.web: unknown keys \['text_field'\]"),
    ([{"name": "web", "path": "a", "min_chars": "many"}],
     r"data.sources.web.min_chars='many': expected an integer"),
    ([{"name": "web", "path": "a", "min_chars": 0}],
     r"data.sources.web: data.min_chars=0 must be > 0"),
    ([{"name": "web", "path": "a", "document_boundary": "page"}],
     r"data.sources.web: data.document_boundary='page' must be one of"),
    ("web=a", r"data.sources='web=a': expected a list of sources"),
    (["web=a"], r"data.sources\[0\]='web=a': expected an object"),
])
def test_bad_sources_are_refused_in_one_line_naming_the_field(sources, message):
    if message is None:
        assert _mix(sources).data.sources == ()
        return
    with pytest.raises(ValueError, match=message) as info:
        _mix(sources)
    assert "\n" not in str(info.value)


def test_a_source_is_typed():
    source = DataSource("web", "/a", weight=3)
    assert source.weight == 3.0 and isinstance(source.weight, float)
    assert source.settings() == {}
    assert DataSource("web", "/a", quality_filter=False).settings() == {"quality_filter": False}
    assert set(configs.SOURCE_SETTINGS) <= {f for f in configs.DataConfig.__dataclass_fields__}


# -- --data NAME=PATH, --weight NAME=W, --source-set NAME.FIELD=VALUE ---------------------

@pytest.mark.parametrize("value, expected", [
    ("web=corpora/web", ("web", "corpora/web")),
    ("web=gs://bucket/web/*.txt", ("web", "gs://bucket/web/*.txt")),
    ("web=a=b", ("web", "a=b")),
    ("my_src2=x", ("my_src2", "x")),
    ("gs://bucket/x.txt", (None, "gs://bucket/x.txt")),
    ("gs://bucket/k=v/x.txt", (None, "gs://bucket/k=v/x.txt")),
    ("/data/year=2024/*.txt", (None, "/data/year=2024/*.txt")),
    ("./a=b", (None, "./a=b")),
    ("data/a=b", (None, "data/a=b")),
    ("Web=x", (None, "Web=x")),
    ("we-b=x", (None, "we-b=x")),
    ("web=", (None, "web=")),
    ("=x", (None, "=x")),
    ("corpus.txt", (None, "corpus.txt")),
])
def test_the_rule_for_name_equals_path(value, expected):
    assert split_source_arg(value) == expected


def test_named_sources_weights_and_settings_parse():
    sources = parse_sources(
        ["web=/c/web", "poems=gs://b/poems.jsonl", "code=src=1/*.py"],
        ["web=9", "poems= 1e0"],
        ["poems.jsonl_text_field=content", "poems.min_chars=5", "code.quality_filter=true",
         "poems.redact_pii=1", " code.prompt_field =123"])
    assert [(s.name, s.path, s.weight) for s in sources] == [
        ("web", "/c/web", 9.0), ("poems", "gs://b/poems.jsonl", 1.0), ("code", "src=1/*.py", 1.0)]
    assert sources[1].settings() == {"jsonl_text_field": "content", "min_chars": 5,
                                     "redact_pii": True}
    assert sources[2].settings() == {"quality_filter": True, "prompt_field": "123"}
    assert configs.normalized_weights(sources) == {"web": 9 / 11, "poems": 1 / 11,
                                                   "code": 1 / 11}


def test_a_bare_path_is_the_one_source_case():
    assert parse_sources(["corpus.txt"]) == ()
    assert parse_sources([]) == ()
    assert parse_sources(["gs://bucket/k=v/x.txt"]) == ()


@pytest.mark.parametrize("data, weights, settings, message", [
    (["a.txt", "web=b"], [], [],
     "--data a.txt: a path without NAME= cannot be one of several sources; name each"),
    (["a.txt", "b.txt"], [], [], "--data b.txt: a path without NAME="),
    (["web=a", "web=b"], [], [], "--data web=b: the source name 'web' is given twice"),
    (["a.txt"], ["web=2"], [], "--weight web=2: only for named sources, given as --data NAME=PATH"),
    ([], ["web=2"], [], "--weight web=2: only for named sources"),
    (["a.txt"], [], ["web.min_chars=3"], "--source-set web.min_chars=3: only for named"),
    (["web=a"], ["wiki=2"], [], "--weight wiki=2: no source 'wiki'; the sources are web"),
    (["web=a"], ["web"], [], "--weight web: expected NAME=W"),
    (["web=a"], ["web=2", "web=3"], [], "--weight web=3: the weight of 'web' is given twice"),
    (["web=a"], ["web=0"], [], "--weight web='0': a weight must be a finite number > 0"),
    (["web=a"], ["web=-1"], [], "--weight web='-1': a weight"),
    (["web=a"], ["web=x"], [], "--weight web='x': a weight"),
    (["web=a"], ["web=nan"], [], "--weight web='nan': a weight"),
    (["web=a"], ["web=inf"], [], "--weight web='inf': a weight"),
    (["web=a"], [], ["wiki.min_chars=3"], "--source-set wiki.min_chars=3: no source 'wiki'"),
    (["web=a"], [], ["web.min_chars"], "--source-set web.min_chars: expected NAME.FIELD=VALUE"),
    (["web=a"], [], ["web=3"], "--source-set web=3: expected NAME.FIELD=VALUE"),
    (["web=a"], [], ["web.near_dedup=false"],
     "--source-set web.near_dedup=false: a source may set one of document_boundary"),
    (["web=a"], [], ["web.weight=2"], "(its weight: --weight)"),
    (["web=a"], [], ["web.min_chars=x"], "--source-set web.min_chars='x': expected an integer"),
    (["web=a"], [], ["web.min_chars=1", "web.min_chars=2"],
     "--source-set web.min_chars=2: web.min_chars is given twice"),
])
def test_bad_source_arguments_are_refused_naming_the_argument(data, weights, settings, message):
    with pytest.raises(ValueError) as info:
        parse_sources(data, weights, settings)
    assert message in str(info.value) and "\n" not in str(info.value)


# -- the command line ----------------------------------------------------------------------

def _refusal(argv) -> str:
    import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    message = str(info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.fixture
def corpora(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "web.txt").write_text("a web page\n\nanother page\n")
    (tmp_path / "poems.jsonl").write_text('{"content": "a poem"}\n')
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["--data", "web=web.txt", "--weight", "wiki=2"],
     "error: --weight wiki=2: no source 'wiki'; the sources are web (--data NAME=PATH)"),
    (["--data", "web=web.txt", "--data", "web=poems.jsonl"],
     "error: --data web=poems.jsonl: the source name 'web' is given twice"),
    (["--data", "web.txt", "--weight", "web=2"],
     "error: --weight web=2: only for named sources, given as --data NAME=PATH"),
    (["--data", "web=web.txt", "--weight", "web=-3"],
     "error: --weight web='-3': a weight must be a finite number > 0"),
    (["--data", "web=web.txt", "--weight", "web=lots"],
     "error: --weight web='lots': a weight must be a finite number > 0"),
    (["--data", "web.txt", "--data", "poems=poems.jsonl"],
     "error: --data web.txt: a path without NAME= cannot be one of several sources"),
    (["--data", "web=missing.txt"],
     "error: source 'web': --data 'missing.txt': no such file or directory"),
    (["--data", "web=web.txt", "--source-set", "web.min_chars=0"],
     "error: data.sources.web: data.min_chars=0 must be > 0"),
    (["--data", "web=web.txt", "--set", 'data.sources=[{"name": "x", "path": "web.txt"}]'],
     "error: --data and --set data.sources both give the data; give one of them"),
    (["--set", 'data.sources=[{"name": "x", "path": "nope.txt"}]'],
     "error: source 'x': --data 'nope.txt': no such file or directory"),
])
def test_the_cli_refuses_bad_sources_in_one_line(corpora, args, message):
    assert _refusal(["run", "--preset", "tiny", *args]).startswith(message)


def test_a_name_equals_path_that_is_also_a_path_is_ambiguous(corpora):
    (corpora / "a=b").mkdir()
    (corpora / "a=b" / "x.txt").write_text("text\n")
    (corpora / "b").mkdir()
    assert _refusal(["run", "--preset", "tiny", "--data", "a=b/x.txt"]) == (
        "error: --data 'a=b/x.txt' is both the source 'a' at 'b/x.txt' and an existing path: "
        "write './a=b/x.txt' for the path, or 'a=./b/x.txt' for the source")
    import cli
    from cli.settings import config_from_args

    parser = cli.build_parser()
    for value in ("./a=b/x.txt", str(corpora / "a=b" / "x.txt")):  # a path, one source
        args = parser.parse_args(["run", "--preset", "tiny", "--data", value])
        assert config_from_args(args).data.sources == ()
    (corpora / "b" / "x.txt").write_text("text\n")
    args = parser.parse_args(["run", "--preset", "tiny", "--data", "a=./b/x.txt"])
    (source,) = config_from_args(args).data.sources
    assert (source.name, source.path) == ("a", str(corpora / "b" / "x.txt"))


def test_the_cli_builds_the_sources_with_absolute_paths(corpora):
    import cli
    from cli.settings import config_from_args, default_output

    (corpora / "dir").mkdir()
    args = cli.build_parser().parse_args([
        "run", "--preset", "tiny", "--data", "web=web.txt", "--data", "poems=poems.jsonl",
        "--data", "more=dir", "--weight", "web=7", "--weight", "poems=2",
        "--source-set", "poems.jsonl_text_field=content", "--source-set", "web.min_chars=5"])
    data = config_from_args(args).data
    assert [(s.name, s.path, s.weight) for s in data.sources] == [
        ("web", str(corpora / "web.txt"), 7.0), ("poems", str(corpora / "poems.jsonl"), 2.0),
        ("more", str(corpora / "dir" / "*"), 1.0)]
    assert data.for_source("poems").jsonl_text_field == "content"
    assert data.for_source("web").min_chars == 5 and data.for_source("more").min_chars == 1
    assert default_output(args) == "runs/web+poems+more-tiny"


def test_run_lists_the_sources_with_their_shares_and_hands_them_to_the_pipeline(
        corpora, capsys, monkeypatch):
    """Two sources: `run` prints them and gives the runner the config with both (the
    runner is replaced here; the pipeline that reads them runs in the e2e tier)."""
    import cli
    from pipeline import local_runner

    seen = {}

    def runner(config, input_base, pattern, output_dir, **options):
        seen.update(config=config, input_base=input_base, pattern=pattern)
        raise SystemExit("error: stopped by the test")

    monkeypatch.setattr(local_runner, "run_local", runner)
    with pytest.raises(SystemExit, match="stopped by the test"):
        cli.main(["run", "--preset", "tiny", "--output", str(corpora / "out"),
                  "--data", "web=web.txt", "--data", "poems=poems.jsonl",
                  "--weight", "web=7", "--weight", "poems=3",
                  "--source-set", "poems.jsonl_text_field=content"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "deepseek-tfx: preset tiny, data 2 sources (name, share of the training batches, path)",
        f"                web    0.700  {corpora / 'web.txt'}",
        f"                poems  0.300  {corpora / 'poems.jsonl'}  (jsonl_text_field=content)"]
    assert [s.name for s in seen["config"].data.sources] == ["web", "poems"]
    # FileBasedExampleGen's own input is the first source's (TFX needs one input_base).
    assert (seen["input_base"], seen["pattern"]) == (str(corpora), "web.txt")


def test_replay_without_a_base_model_is_refused(corpora):
    message = _refusal(["run", "--preset", "tiny", "--output", str(corpora / "out"),
                        "--data", "web.txt", "--set", "data.replay_fraction=0.2"])
    assert message == ("error: replay (data.replay_fraction, --replay-data) mixes in the "
                       "base model's data: give --base-model")


@pytest.mark.parametrize("data, first_line", [
    (["--data", "web.txt"], "deepseek-tfx: preset tiny, data {root}/web.txt"),
    (["--data", "web=web.txt"], "deepseek-tfx: preset tiny, data 1 source "
                                "(name, share of the training batches, path)"),
])
def test_one_source_runs_as_before(corpora, monkeypatch, capsys, data, first_line):
    """A bare path and one named source both reach the runner as (input_base, pattern);
    the named one also travels in `data.sources`. (A stand-in runner: no TFX.)"""
    import sys
    import types

    import cli

    calls = []

    def run_local(config, input_base, pattern, output_dir, **kwargs):
        calls.append((config, input_base, pattern))
        raise SystemExit("stop here")

    monkeypatch.setitem(sys.modules, "pipeline.local_runner",
                        types.SimpleNamespace(run_local=run_local))
    with pytest.raises(SystemExit, match="stop here"):
        cli.main(["run", "--preset", "tiny", "--output", str(corpora / "out"), *data])
    ((config, input_base, pattern),) = calls
    assert (input_base, pattern) == (str(corpora), "web.txt")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == first_line.format(root=corpora)
    if "web=web.txt" in data:
        assert [s.name for s in config.data.sources] == ["web"]
        assert out[1] == f"                web  1.000  {corpora / 'web.txt'}"
    else:
        assert config.data.sources == ()


def test_validate_takes_named_sources_and_names_a_bad_one(corpora):
    message = _refusal(["validate", "--output", str(corpora / "out"), "--data", "web=web.txt",
                        "--data", "poems=missing.jsonl"])
    assert message.startswith("error: source 'poems': --data '") and "no such file" in message


def test_a_bucket_path_stays_a_path_and_is_split_for_examplegen():
    from cli.data import checked_sources, split_data_path

    config = configs.get_config("tiny", configs.parse_set([
        'data.sources=[{"name": "web", "path": "gs://corpora/web/*.jsonl"}, '
        '{"name": "poems", "path": "gs://corpora/k=v/poems.txt"}]']))
    assert [s.path for s in checked_sources(config).data.sources] == [
        "gs://corpora/web/*.jsonl", "gs://corpora/k=v/poems.txt"]
    assert split_data_path("gs://corpora/k=v/poems.txt") == ("gs://corpora/k=v", "poems.txt")
    with pytest.raises(SystemExit, match="name the files in the bucket"):
        split_data_path("gs://corpora")


def test_sft_from_two_sources_is_refused_before_anything_runs(corpora):
    message = _refusal(["run", "--preset", "tiny", "--task", "sft", "--output",
                        str(corpora / "out"), "--data", "web=web.txt",
                        "--data", "poems=poems.jsonl"])
    assert message.startswith("error: data.task=sft with data.sources ['poems', 'web']")
