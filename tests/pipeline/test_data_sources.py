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
    assert again["data"] == {**old["data"], "sources": []}
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
