"""Named data sources with weights: the mixture of `data.sources` (issue 28).

  deepseek-tfx run --data web=corpora/web --data poems=corpora/poems.jsonl \\
      --weight web=9 --weight poems=1 --source-set poems.jsonl_text_field=content

gives `data.sources = (DataSource("web", ...,  weight=9.0),
DataSource("poems", ..., weight=1.0, jsonl_text_field="content"))`, in the order given.
Weights are relative (7:2:1 is 0.7, 0.2, 0.1: `normalized_weights`); a source without
`--weight` weighs 1.

The one-source case: a bare `--data PATH` (and every config written before sources
existed) leaves `data.sources` empty. The path reaches the pipeline as it always did
(`create_pipeline(input_base, input_pattern)`), and that one source is named
`DEFAULT_SOURCE` ("default") wherever a name is needed (`source_names`).

`--data VALUE` is NAME=PATH when the text before its first '=' is a source name
(`[a-z0-9_]+`) and some text follows the '='; otherwise all of VALUE is a path, so
`gs://bucket/k=v/x.txt`, `/data/year=2024/*.txt` and `./a=b` stay paths
(`split_source_arg`). The CLI refuses a NAME=PATH whose whole VALUE is also an existing
file or directory (`cli/data.py`): write `./VALUE` for the path, or `NAME=VALUE`.

Each source may set, for its own records only, the reading and cleaning fields of
`SOURCE_SETTINGS` (`--source-set NAME.FIELD=VALUE`); the rest of `data` is shared, above
all what compares documents across sources (normalization, exact and near-duplicate
removal) and the train/eval split. `DataConfig.for_source(name)` is the `data` section
as that source's records see it.

This module imports nothing of `config.data` (which holds `DataSource` in `DataConfig`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

from config.overrides import coerce, parse_set, typed_section

DEFAULT_SOURCE = "default"
# The source of a continued run's replayed data (`data.replay_fraction`, `--replay-data`).
REPLAY_SOURCE = "replay"
SOURCE_NAME = re.compile(r"[a-z0-9_]+")
# The `data` fields a source may set for its own records: how its files are read and
# how its documents are cleaned. Everything else in `data` is one setting for the mixture.
SOURCE_SETTINGS = (
    "document_boundary", "jsonl_text_field", "csv_text_column", "parquet_text_column",
    "prompt_field", "response_field", "messages_field", "chosen_field", "rejected_field",
    "answer_field", "invalid_utf8", "min_chars", "max_chars", "quality_filter", "redact_pii",
    "max_reject_fraction",
)


@dataclasses.dataclass(frozen=True)
class DataSource:
    """One named source of a mixture.

    Attributes:
      name: `[a-z0-9_]+`, unique in the mixture; it names the source's records,
        statistics and metrics.
      path: a file, a directory or a glob (`--data`), local or `gs://...`.
      weight: the source's share of the training batches, relative to the others'
        (> 0, finite).
      document_boundary, jsonl_text_field, csv_text_column, parquet_text_column: this
        source's own value of the `data` field of that name (`SOURCE_SETTINGS`); None
        takes the mixture's.
      prompt_field, response_field, messages_field, chosen_field, rejected_field: this
        source's own value of the `data` field of that name; None takes the mixture's.
      answer_field, invalid_utf8, min_chars, max_chars, quality_filter, redact_pii: this
        source's own value of the `data` field of that name; None takes the mixture's.
      max_reject_fraction: this source's own value of the `data` field of that name;
        None takes the mixture's.
    """

    name: str
    path: str
    weight: float = 1.0
    document_boundary: str | None = None
    jsonl_text_field: str | None = None
    csv_text_column: str | None = None
    parquet_text_column: str | None = None
    prompt_field: str | None = None
    response_field: str | None = None
    messages_field: str | None = None
    chosen_field: str | None = None
    rejected_field: str | None = None
    answer_field: str | None = None
    invalid_utf8: str | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    quality_filter: bool | None = None
    redact_pii: bool | None = None
    max_reject_fraction: float | None = None

    def __post_init__(self) -> None:
        check_source_name("data.sources.name", self.name)
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(f"data.sources.{self.name}.path={self.path!r}: must be a "
                             "non-empty path")
        object.__setattr__(self, "weight", check_weight(f"data.sources.{self.name}.weight",
                                                        self.weight))

    def settings(self) -> dict[str, Any]:
        """The `data` fields this source sets for itself: {field: value}, None left out."""
        return {name: getattr(self, name) for name in SOURCE_SETTINGS
                if getattr(self, name) is not None}


def check_source_name(key: str, name: Any) -> str:
    """`name` when it is a source name (`[a-z0-9_]+`); else ValueError naming `key`."""
    if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
        raise ValueError(f"{key}={name!r}: a source name must match [a-z0-9_]+")
    return name


def check_weight(key: str, weight: Any) -> float:
    """`weight` (a number, or its text) as a float > 0 and finite; else ValueError
    naming `key` and the value."""
    value = None
    if isinstance(weight, (int, float, str)) and not isinstance(weight, bool):
        try:
            value = float(weight.strip() if isinstance(weight, str) else weight)
        except (ValueError, OverflowError):  # not a number; an int beyond float's range
            pass
    if value is None or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{key}={weight!r}: a weight must be a finite number > 0")
    return value


def data_sources(value: Any) -> tuple[DataSource, ...]:
    """`data.sources` as a tuple of `DataSource`, from a tuple or list of sources or of
    their dict forms (JSON, `--set data.sources=[...]`); names checked unique.

    Raises:
      ValueError: not a list, an entry that is neither, an unknown key, a value of the
        wrong type (`data.sources.NAME.FIELD`), a bad name, path or weight, a name
        given twice.
    """
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"data.sources={value!r}: expected a list of sources "
                         '[{"name": ..., "path": ..., "weight": ...}]')
    sources = tuple(_source(i, entry) for i, entry in enumerate(value))
    seen: set[str] = set()
    for source in sources:
        if source.name in seen:
            raise ValueError(f"data.sources: the source name {source.name!r} is given twice")
        seen.add(source.name)
    if not math.isfinite(sum(s.weight for s in sources)):
        raise ValueError("data.sources: the weights' sum overflows; scale them down")
    return sources


def _source(index: int, entry: Any) -> DataSource:
    if isinstance(entry, DataSource):
        return entry
    if not isinstance(entry, dict):
        raise ValueError(f"data.sources[{index}]={entry!r}: expected an object "
                         '{"name": ..., "path": ..., "weight": ...}')
    fields = {f.name for f in dataclasses.fields(DataSource)}
    name = entry.get("name")
    key = f"data.sources.{name}" if isinstance(name, str) and SOURCE_NAME.fullmatch(name) \
        else f"data.sources[{index}]"
    unknown = sorted(set(entry) - fields)
    if unknown:
        raise ValueError(f"{key}: unknown keys {unknown}; a source has {sorted(fields)}")
    for required in ("name", "path"):
        if required not in entry:
            raise ValueError(f"{key}: no {required!r}")
    check_source_name(f"{key}.name", name)
    values = typed_section(key, DataSource, {k: v for k, v in entry.items() if k != "weight"})
    if "weight" in entry:  # any number or its text, refused in the weight's own words
        values["weight"] = check_weight(f"{key}.weight", entry["weight"])
    return DataSource(**values)


def normalized_weights(sources: tuple[DataSource, ...]) -> dict[str, float]:
    """{name: weight / sum of weights}, in the sources' order; {"default": 1.0} for the
    one-source case (no sources)."""
    if not sources:
        return {DEFAULT_SOURCE: 1.0}
    total = math.fsum(s.weight for s in sources)  # finite: `data_sources` checked it
    return {s.name: s.weight / total for s in sources}


def source_names(sources: tuple[DataSource, ...]) -> tuple[str, ...]:
    """The sources' names in order; ("default",) for the one-source case."""
    return tuple(s.name for s in sources) or (DEFAULT_SOURCE,)


def split_source_arg(value: str) -> tuple[str | None, str]:
    """`--data VALUE` -> (NAME, PATH) for NAME=PATH, else (None, VALUE): NAME=PATH when
    the text before the first '=' matches [a-z0-9_]+ and text follows the '='.

    `gs://b/k=v/x` (':' and '/' before the '='), `/data/year=2024/*.txt`, `./a=b` -> a
    path; `web=gs://b/x` -> ("web", "gs://b/x"); `web=a=b` -> ("web", "a=b").
    """
    name, sep, path = value.partition("=")
    if sep and path and SOURCE_NAME.fullmatch(name):
        return name, path
    return None, value


def parse_sources(data: list[str], weights: list[str] | None = None,
                  settings: list[str] | None = None) -> tuple[DataSource, ...]:
    """The sources of `--data NAME=PATH ...`, `--weight NAME=W ...` and
    `--source-set NAME.FIELD=VALUE ...`; () for one bare `--data PATH` (or none) with
    neither `--weight` nor `--source-set`.

    Raises:
      ValueError: one line naming the argument: a bare path beside named sources or a
        second bare path, a name given twice, a weight or setting for a source not
        given or given twice, W not a finite number > 0, a FIELD not in
        `SOURCE_SETTINGS`, a VALUE of the wrong type.
    """
    weights, settings = weights or [], settings or []
    named: dict[str, dict[str, Any]] = {}
    bare = []
    for value in data:
        name, path = split_source_arg(value)
        if name is None:
            bare.append(value)
        elif name in named:
            raise ValueError(f"--data {value}: the source name {name!r} is given twice")
        else:
            named[name] = {"name": name, "path": path}
    if bare and (named or len(bare) > 1):
        raise ValueError(f"--data {bare[-1 if not named else 0]}: a path without NAME= "
                         "cannot be one of several sources; name each: --data NAME=PATH")
    if not named:
        if weights or settings:
            option, item = ("--weight", weights[0]) if weights else ("--source-set", settings[0])
            raise ValueError(f"{option} {item}: only for named sources, given as "
                             "--data NAME=PATH")
        return ()
    for item in weights:
        name, sep, weight = item.partition("=")
        name = name.strip()
        _check_named(named, "--weight", item, name, sep, "NAME=W")
        if "weight" in named[name]:
            raise ValueError(f"--weight {item}: the weight of {name!r} is given twice")
        named[name]["weight"] = check_weight(f"--weight {name}", weight)
    for item in settings:
        _check_named(named, "--source-set", item, item.partition(".")[0].strip(),
                     "=" in item and "." in item.partition("=")[0], "NAME.FIELD=VALUE")
        ((key, value),) = parse_set([item]).items()  # VALUE: JSON where it parses, else text
        name, _, field = key.partition(".")
        if field not in SOURCE_SETTINGS:
            raise ValueError(f"--source-set {item}: a source may set one of "
                             f"{', '.join(SOURCE_SETTINGS)} (its weight: --weight)")
        if field in named[name]:
            raise ValueError(f"--source-set {item}: {name}.{field} is given twice")
        named[name][field] = coerce(f"--source-set {key}", value, _setting_type(field))
    return data_sources(list(named.values()))


def _check_named(named: dict, option: str, item: str, name: str, sep: Any, form: str) -> None:
    if not sep:
        raise ValueError(f"{option} {item}: expected {form}")
    if name not in named:
        raise ValueError(f"{option} {item}: no source {name!r}; the sources are "
                         f"{', '.join(named)} (--data NAME=PATH)")


def _setting_type(field: str) -> type:
    """The declared type of a setting without its `| None`."""
    hint = typing.get_type_hints(DataSource)[field]
    return next(t for t in typing.get_args(hint) if t is not type(None))
