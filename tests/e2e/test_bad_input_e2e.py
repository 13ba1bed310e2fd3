"""End to end: a corpus with every kind of bad input goes through `validate` and `run`.

The corpus (a directory) mixes real text with: bytes that are not UTF-8, NUL
bytes, an empty file, whitespace-only documents, JSON lines that do not parse,
JSON records without the text field, a line longer than `data.max_chars`, a CSV
file and exact duplicates. Nothing crashes, each case is counted under its
reason, and records read = kept + dropped, in the report and in ML Metadata.
An unreadable path stops the run with an error naming the file. Too many rejected
records, and anomalies against a stricter schema, stop the pipeline before training.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

import cli

SETTINGS = ["--preset", "tiny", "--set", "data.max_chars=2000"]


@pytest.fixture(scope="module")
def bad_corpus(tmp_path_factory, shakespeare):
    d = tmp_path_factory.mktemp("bad_corpus")
    text = shakespeare[:40_000]
    (d / "plays.txt").write_text(text[: text.rfind("\n\n") + 2])
    (d / "bad_utf8.txt").write_bytes(b"caf\xe9 au lait, said the cook.\n\nA fine paragraph.\n")
    (d / "nul.txt").write_bytes(b"a NUL\x00 inside this line\n\n   \t  \n\n")
    (d / "empty.txt").write_bytes(b"")
    # One 4,889-character line: 3 pieces of <= 2,000 characters.
    (d / "long.txt").write_text(" ".join(f"w{i}" for i in range(1000)) + "\n")
    records = [json.dumps({"text": "a good record"}), "{broken json",
               json.dumps({"body": "no text field"}), json.dumps({"text": 42}),
               json.dumps({"text": "a good record"})]  # the last: an exact duplicate
    (d / "records.jsonl").write_text("\n".join(records) + "\n")
    (d / "table.csv").write_text('id,text\n1,"a row of text, with a comma"\n2\n')
    return d


EXPECTED_DROPS = {
    "empty_file": 1,  # empty.txt
    "empty": 1,  # the whitespace-only paragraph of nul.txt
    "invalid_json": 1,
    "missing_text_field": 2,  # records.jsonl record 2, table.csv row 1
    "text_not_string": 1,
}
EXPECTED_REPAIRS = {"invalid_utf8_replaced": 1, "nul_bytes_removed": 1,
                    "split_long_document": 3}


def _check_report(report, corpus):
    from corpus.documents import split_text

    total = report["total"]
    assert total["read"] == total["kept"] + total["dropped"]
    for split in report["splits"].values():
        assert split["read"] == split["kept"] + split["dropped"]
    drops = total["dropped_by_reason"]
    for reason, n in EXPECTED_DROPS.items():
        assert drops.get(reason) == n, (reason, drops)
    # The duplicate JSON record, plus the paragraphs Shakespeare repeats in the slice.
    paragraphs = split_text((corpus / "plays.txt").read_text())
    assert drops.get("exact_duplicate") == 1 + len(paragraphs) - len(set(paragraphs))
    for repair, n in EXPECTED_REPAIRS.items():
        assert total["repaired"].get(repair) == n, (repair, total["repaired"])


def _report(output_dir):
    from pipeline.local_runner import run_paths
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(run_paths(str(output_dir))["metadata_path"])}
    cleaned = runs["TextCleaner"].outputs["Examples"]
    assert cleaned["records_read"] == cleaned["records_kept"] + cleaned["records_dropped"]
    with open(os.path.join(cleaned["uri"], "cleaning_report.json")) as f:
        return json.load(f), runs


def test_validate_counts_every_case(bad_corpus, tmp_path, capsys):
    out = tmp_path / "validate"
    assert cli.main(["validate", "--data", str(bad_corpus), "--output", str(out), *SETTINGS]) == 0
    printed = capsys.readouterr().out
    assert "dropped invalid_json" in printed and "records.jsonl record 1" in printed
    report, runs = _report(out)
    _check_report(report, bad_corpus)
    assert "Transform" not in runs and "Trainer" not in runs


def test_run_trains_on_what_is_left(bad_corpus, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["run", "--data", str(bad_corpus), "--output", str(out), *SETTINGS]) == 0
    report, runs = _report(out)
    _check_report(report, bad_corpus)
    assert runs["Pusher"].outputs["PushedModel"]["pushed"] == 1


def test_unreadable_path_stops_with_its_name(bad_corpus, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "fine.txt").write_text((bad_corpus / "plays.txt").read_text())
    os.symlink(tmp_path / "nowhere.txt", corpus / "dangling.txt")
    code = cli.main(["validate", "--data", str(corpus), "--output", str(tmp_path / "v"),
                     *SETTINGS])
    assert code == 1
    assert "dangling.txt" in capsys.readouterr().out


# ------------------------------------------------ bad data stops the run before training


def _run_expecting_failure(tmp_path, data, **kwargs):
    from config import get_config
    from pipeline.local_runner import run_local

    input_base, pattern = os.path.dirname(str(data)), os.path.basename(str(data))
    with pytest.raises(Exception) as info:
        run_local(get_config("tiny"), input_base, pattern, str(tmp_path / "out"), **kwargs)
    return str(info.value)


def test_too_many_rejects_stop_before_training(tmp_path):
    data = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": f"good document number {i}"}) for i in range(5)]
    lines += ["{broken json"] * 8 + [json.dumps({"body": "no text field"})] * 2
    data.write_text("\n".join(lines) + "\n")
    message = _run_expecting_failure(tmp_path, data)
    assert "records rejected" in message
    assert "invalid_json: 8" in message and "bad.jsonl record" in message
    assert not glob.glob(str(tmp_path / "out" / "pipeline_root" / "Trainer" / "model" / "*" / "*"))


def test_anomalies_stop_before_training(tmp_path, corpus):
    # A stricter schema: no record may carry a reject reason.
    from pipeline.pipeline import SCHEMA_FILE

    schema = open(SCHEMA_FILE).read().replace(
        'name: "reject_reason"\n  type: BYTES\n',
        'name: "reject_reason"\n  type: BYTES\n  string_domain { value: "" }\n',
    )
    schema_path = tmp_path / "strict_schema.pbtxt"
    schema_path.write_text(schema)
    data = tmp_path / "mixed.jsonl"
    data.write_text(json.dumps({"text": "fine"}) + "\n{oops\n")
    message = _run_expecting_failure(tmp_path, data, schema_path=str(schema_path))
    assert "ExampleValidator found anomalies" in message
    assert "reject_reason" in message
