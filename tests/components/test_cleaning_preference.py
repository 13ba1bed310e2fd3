"""TextCleaner on DPO records (issue 29): `clean_dpo_record`'s rules, the `rejected` feature
through the cleaner's parser and writer, and deduplication on (prompt, chosen, rejected).
GRPO records are SFT records for the cleaner (test_cleaning.py)."""

from __future__ import annotations

import json

from config import DataConfig
from corpus import cleaning as C

BOS = "<｜begin▁of▁sentence｜>"


def _p(user: str) -> str:
    return BOS + "User: " + user + "\n\nAssistant: "


def test_dpo_record_rules():
    cfg = DataConfig(task="dpo", min_chars=45, max_chars=60)
    assert len(_p("Hi")) == 42  # 21 (BOS) + 6 ("User: ") + 2 + 13 ("\n\nAssistant: ")
    assert C.clean_dpo_record(_p("Hi"), "Hello", "Go away", "", cfg) == (
        _p("Hi"), "Hello", "Go away", C.KEPT, [])
    # Each sequence is judged: 42 + 2 = 44 < 45 is too short, 42 + 19 = 61 > 60 too long.
    assert C.clean_dpo_record(_p("Hi"), "Hello", "No", "", cfg)[3] == C.DROP_TOO_SHORT
    assert C.clean_dpo_record(_p("Hi"), "Hello", "x" * 19, "", cfg)[3] == C.DROP_TOO_LONG
    assert C.clean_dpo_record(_p("Hi"), "\x00 \x1b", "b", "", cfg) == (
        "", "", "", C.DROP_EMPTY_CHOSEN, [C.REPAIR_NUL_BYTES, C.REPAIR_CONTROL_CHARACTERS])
    assert C.clean_dpo_record(_p("Hi"), "Hello", "\x07", "", cfg)[3] == C.DROP_EMPTY_REJECTED
    # Equal once the control characters are gone.
    assert C.clean_dpo_record(_p("Hi"), "Hello", "Hel\x00lo", "", cfg)[3] == (
        C.DROP_CHOSEN_EQUALS_REJECTED)
    assert C.clean_dpo_record("", "", "", "missing_chosen_field", cfg) == (
        "", "", "", "missing_chosen_field", [])


def test_dpo_record_cleans_all_three_fields():
    cfg = DataConfig(task="dpo", normalization="NFKC", redact_pii=True)
    prompt, chosen, rejected, reason, repairs = C.clean_dpo_record(
        _p("mail me\x07 at a@b.org"), "ｆｕｌｌ, call 555-123-4567", "床前明月光\x1b", "", cfg)
    assert reason == C.KEPT
    assert prompt == _p("mail me at <EMAIL>")  # the BOS text keeps its fullwidth bars
    assert (chosen, rejected) == ("full, call <PHONE_NUMBER>", "床前明月光")
    assert repairs == [C.REPAIR_NORMALIZED, C.REPAIR_CONTROL_CHARACTERS, "redacted_email",
                       "redacted_phone_number"]


def test_dpo_quality_rules_judge_the_chosen_response():
    cfg = DataConfig(task="dpo", quality_filter=True, min_words=5)
    answer = "Good morning to you, my dear friend and neighbour."
    assert C.clean_dpo_record(_p("Hi"), answer, "No.", "", cfg)[3] == C.KEPT
    assert C.clean_dpo_record(_p("Hi"), "No.", answer, "", cfg)[3] == C.DROP_QUALITY_WORD_COUNT


def test_dpo_examples_round_trip_through_the_cleaner_parser():
    from components.text_cleaner.executor import _parse, _to_example

    record = dict(split="train", text="疑是地上霜", source="a.jsonl", record=3,
                  reject_reason="", repairs=["unicode_normalized"], prompt=_p("床前明月光"),
                  source_name="poems", rejected="举头望明月")
    assert _parse(_to_example(record), "train") == record
    empty = dict(record, text="", prompt="", rejected="", repairs=[])
    assert _parse(_to_example(empty), "train") == empty  # "" survives, not None
    # An SFT or GRPO example has no `rejected` key at all.
    sft = {k: v for k, v in record.items() if k != "rejected"}
    assert _parse(_to_example(sft), "train") == sft


def test_dpo_duplicates_are_keyed_on_the_triple(tmp_path):
    """Exact duplicates are equal (prompt, chosen, rejected) triples: another rejected
    response to the same prompt and chosen one is a pair of its own."""
    import apache_beam as beam

    from components.text_cleaner.dedup import FindDuplicates as _FindDuplicates
    from components.text_cleaner.dedup import parse_doc_key, record_keys

    def r(source, record, prompt, chosen, rejected):
        return dict(source=source, record=record, prompt=_p(prompt), text=chosen,
                    rejected=rejected)

    records = [
        r("a.jsonl", 0, "静夜思", "床前明月光", "不知道"),
        r("a.jsonl", 1, "静夜思", "床前明月光", "忘了"),     # another rejected: kept
        r("a.jsonl", 2, "静夜思", "不知道", "床前明月光"),   # swapped: kept
        r("b.jsonl", 0, "静夜思", "床前明月光", "不知道"),   # the same triple: dropped
    ]
    data = DataConfig(task="dpo", near_dedup=False)
    packed = [record_keys(x, 0, data) for x in records]
    out = str(tmp_path / "duplicates")
    with beam.Pipeline() as p:
        _ = (p | beam.Create(packed)
             | beam.io.WriteToTFRecord(str(tmp_path / "keys"))
             | _FindDuplicates(data, num_bits=1 << 16)
             | beam.Map(lambda kv: json.dumps([kv[0].hex(), kv[1][0], kv[1][1].hex()]))
             | beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    found = [json.loads(line) for line in open(out)]
    assert [(parse_doc_key(bytes.fromhex(k), ["train"])[2:], reason,
             parse_doc_key(bytes.fromhex(kept), ["train"])[2:]) for k, reason, kept in found] == [
        (("b.jsonl", 0), C.DROP_EXACT_DUPLICATE, ("a.jsonl", 0))]
    # The triple's key is none of the pair keys, and the fields cannot run into each other.
    assert C.dpo_content_key("p", "a", "b") != C.sft_content_key("p", "a")
    assert C.dpo_content_key("p", "a", "b") != C.dpo_content_key("p", "ab", "")
    assert C.dpo_dedup_text("p", "a", "b") == "p\na\nb"
