"""Cleaning rules, one reason each."""

from __future__ import annotations

import json

import pytest

from config import DataConfig
from corpus import cleaning as C


def test_control_characters_removed_but_newlines_and_tabs_kept():
    assert C.remove_control_characters("a\x00b\x1bc\r\nd\te") == "abc\nd\te"


def test_normalization_forms():
    decomposed = "cafe\u0301"
    assert C.normalize(decomposed, "NFC") == "caf\u00e9"
    assert C.normalize("\ufb01", "NFKC") == "fi"
    assert C.normalize(decomposed, "none") == decomposed


def test_reasons():
    cfg = DataConfig(min_chars=3, max_chars=10)
    assert C.clean_document("hello", "", cfg) == ("hello", C.KEPT, [])
    assert C.clean_document(" \n\t", "", cfg) == ("", C.DROP_EMPTY, [])
    assert C.clean_document("\x00\x01", "", cfg) == (
        "", C.DROP_EMPTY, [C.REPAIR_NUL_BYTES, C.REPAIR_CONTROL_CHARACTERS])
    assert C.clean_document("hi", "", cfg) == ("", C.DROP_TOO_SHORT, [])
    assert C.clean_document("x" * 11, "", cfg) == ("", C.DROP_TOO_LONG, [])
    assert C.clean_document("fine text", "invalid_json", cfg) == ("", "invalid_json", [])
    assert C.clean_document("a\x00b\x00c", "", cfg) == ("abc", C.KEPT, [C.REPAIR_NUL_BYTES])
    assert C.clean_document("cafe\u0301!", "", cfg) == ("caf\u00e9!", C.KEPT,
                                                         [C.REPAIR_NORMALIZED])


def test_content_key_is_exact():
    assert C.content_key("a b") == C.content_key("a b")
    assert C.content_key("a b") != C.content_key("a  b")



def test_redaction_of_emails_ips_and_phone_numbers():
    text = ("Write to jane.doe@example.org or call +1 415-555-0134 / (020) 7946 0958; "
            "the server is 192.168.10.254. Act 3, scene 2, lines 10-12 stay.")
    out, found = C.redact(text)
    assert out == ("Write to <EMAIL> or call <PHONE_NUMBER> / <PHONE_NUMBER>; "
                   "the server is <IP_ADDRESS>. Act 3, scene 2, lines 10-12 stay.")
    assert found == ["redacted_email", "redacted_ip_address", "redacted_phone_number"]
    cfg = DataConfig(redact_pii=True)
    assert C.clean_document("mail a@b.co now", "", cfg) == (
        "mail <EMAIL> now", C.KEPT, ["redacted_email"])
    assert C.clean_document("mail a@b.co now", "", DataConfig())[0] == "mail a@b.co now"


def test_gopher_quality_rules_by_hand():
    cfg = DataConfig(quality_filter=True, min_words=5, max_words=50)
    good = "The quick brown fox jumps over the lazy dog near the river bank today."
    assert C.quality_reason(good, cfg) == ""
    assert C.quality_reason("Too few words here.", cfg) == C.DROP_QUALITY_WORD_COUNT
    # Mean word length 1: "a b c d e f"
    assert C.quality_reason("a b c d e f", cfg) == C.DROP_QUALITY_MEAN_WORD_LENGTH
    # 2 hashes / 6 words = 0.33 > 0.1
    assert C.quality_reason("#tag #other words follow right here", cfg) == (
        C.DROP_QUALITY_SYMBOL_RATIO)
    # 4 lines, 2 of them repeats: 2/4 = 0.5 > 0.3
    repeated = "buy cheap pills now\nbuy cheap pills now\nbuy cheap pills now\nreal text line"
    assert C.quality_reason(repeated, cfg) == C.DROP_QUALITY_DUPLICATE_LINES
    # 2 of 6 words have a letter: 0.33 < 0.8
    assert C.quality_reason("1234 5678 9012 3456 word more", cfg) == C.DROP_QUALITY_ALPHA_WORDS
    assert C.clean_document(good, "", cfg) == (good, C.KEPT, [])
    assert C.clean_document("a b c d e f", "", cfg)[1] == C.DROP_QUALITY_MEAN_WORD_LENGTH


def test_minhash_estimates_jaccard():
    base = " ".join(f"word{i}" for i in range(200))
    edited = base.replace("word50", "changed").replace("word150", "other")
    a, b = (C.minhash_signature(t, 128, 5) for t in (base, edited))
    sa, sb = C.shingles(base, 5), C.shingles(edited, 5)
    true_jaccard = len(sa & sb) / len(sa | sb)  # 186 shared of 206: ~0.90
    assert abs(C.estimated_jaccard(a, b) - true_jaccard) < 0.1
    unrelated = C.minhash_signature(" ".join(f"x{i}" for i in range(200)), 128, 5)
    assert C.estimated_jaccard(a, unrelated) < 0.1
    bands, rows = C.lsh_parameters(0.8, 128)
    assert bands * rows <= 128 and len(C.lsh_bands(a, bands, rows)) == bands


def _find_duplicates(records, data, tmp_path, kept=False):
    """Runs the executor's `_FindDuplicates` on records as the executor builds them."""
    from components.text_cleaner.dedup import doc_key, pack_keys

    packed = [
        pack_keys(doc_key(0, r["source"], r["record"], r.get("source_name", "default")),
                  C.content_key(r["text"]),
                  C.minhash_signature(r["text"], data.near_dedup_num_perm, data.near_dedup_ngram))
        for r in records
    ]
    return _find_duplicates_packed(packed, data, tmp_path, kept)


def test_near_duplicates_are_removed_and_distinct_documents_kept(shakespeare, tmp_path):
    # Speeches of >= 80 words: one edited word changes at most 5 of their >= 76
    # 5-gram shingles, so an edited copy has Jaccard >= 71/81 = 0.877 with its original.
    paragraphs = [p for p in shakespeare.split("\n\n") if len(p.split()) >= 80][:60]
    assert len(paragraphs) == 60
    records = [dict(source="s.txt", record=i, text=p) for i, p in enumerate(paragraphs)]
    # Plant near-duplicates: small edits of the first five paragraphs, later in the corpus,
    # and exact copies of paragraphs 10 and 11 (one of them twice).
    for i in range(5):
        words = paragraphs[i].split()
        words[len(words) // 2] = "EDITED"
        records.append(dict(source="t.txt", record=i, text=" ".join(words)))
    for j, i in enumerate((10, 11, 11)):
        records.append(dict(source="u.txt", record=j, text=paragraphs[i]))
    found = _find_duplicates(records, DataConfig(near_dedup_threshold=0.8), tmp_path)
    assert found == sorted(
        [(("t.txt", i), C.DROP_NEAR_DUPLICATE) for i in range(5)]
        + [(("u.txt", j), C.DROP_EXACT_DUPLICATE) for j in range(3)])


def test_seen_twice_filter_is_exact_on_absence_and_merges():
    keys = [f"key-{i}".encode() for i in range(2000)]
    a, b = C.SeenTwiceFilter(1 << 16), C.SeenTwiceFilter(1 << 16)
    a.add(C.key_hashes(keys[:1000]))
    b.add(C.key_hashes(keys[900:1100] + [b"twice", b"twice"]))
    assert C.SeenTwiceFilter(1 << 16).may_repeat(C.key_hashes(keys)).sum() == 0
    assert b.may_repeat(C.key_hashes([b"twice"]))[0]
    a.merge(b)
    repeated = a.may_repeat(C.key_hashes(keys[900:1000]))
    assert repeated.all()  # in both parts: never missed (no false negatives)
    once = a.may_repeat(C.key_hashes(keys[:900] + keys[1000:1100]))
    assert once.mean() < 0.01  # false positives at ~1,100 keys in 65,536 bits, 4 hashes
    with pytest.raises(ValueError, match="power of two"):
        C.SeenTwiceFilter(1000)


def test_doc_keys_sort_in_keep_first_order():
    from components.text_cleaner.executor import doc_key, parse_doc_key, split_order

    splits = split_order(["eval", "extra", "train"])
    assert splits == ["train", "eval", "extra"]
    keys = [doc_key(1, "a.txt", 0), doc_key(0, "b.txt", 5), doc_key(0, "a.txt", 300),
            doc_key(0, "a.txt", 2), doc_key(0, "ab.txt", 0),
            doc_key(0, "a.txt", 0, "web"), doc_key(0, "唐诗.txt", 7, "poems")]
    assert [parse_doc_key(k, splits) for k in sorted(keys)] == [
        ("train", "default", "a.txt", 2), ("train", "default", "a.txt", 300),
        ("train", "default", "ab.txt", 0), ("train", "default", "b.txt", 5),
        ("train", "poems", "唐诗.txt", 7), ("train", "web", "a.txt", 0),
        ("eval", "default", "a.txt", 0)]


@pytest.mark.parametrize("input_bytes", [0, 1_000, 46_600_000, 10**10])
def test_bloom_sizes_are_powers_of_two(input_bytes):
    from components.text_cleaner.dedup import SeenTwiceCombineFn as _SeenTwiceCombineFn
    from components.text_cleaner.dedup import bloom_bits

    bits = bloom_bits(input_bytes, bands=9)
    assert bits & (bits - 1) == 0 and 1 << 16 <= bits <= 1 << 32
    if 0 < input_bytes < 10**9:
        exact, near = _SeenTwiceCombineFn(bits, 9, 13, near=True).create_accumulator()
        assert near.num_bits == bits and exact.num_bits & (exact.num_bits - 1) == 0


def test_word_units_follow_the_script():
    from corpus.words import shingle_units, token_units, word_units

    text = "GPT模型很大, ok! 日本語のテキスト 한국어 텍스트 ภาษาไทย"
    assert word_units(text) == ["GPT", "模", "型", "很", "大,", "ok!", "日", "本", "語",
                                "の", "テ", "キ", "ス", "ト", "한국어", "텍스트",
                                "ภ", "า", "ษ", "า", "ไ", "ท", "ย"]
    assert shingle_units("Hello 你好，世界") == ["hello", "你", "好", "世", "界"]
    assert token_units("Hello 你好，世界!") == ["hello", "你", "好", "，", "世", "界", "!"]


def _han(text: str) -> int:
    return sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")


def test_chinese_near_duplicates_are_removed_and_distinct_poems_kept(chinese_poems, tmp_path):
    """Character 5-grams: one changed character of a poem of >= 150 characters (>= 146
    shingles) replaces at most 5 shingles: Jaccard >= (146 - 5) / (146 + 5) = 0.93, where
    the 9 LSH bands of 13 rows (threshold 0.8) miss a pair with probability
    (1 - 0.93^13)^9 < 1%. Whitespace words would make each line one shingle, and the
    copy would share few of them."""
    poems = list(dict.fromkeys(chinese_poems))
    long_ones = [i for i, p in enumerate(poems) if _han(p) >= 150][:6]
    assert len(long_ones) == 6
    records = [dict(source="poems.txt", record=i, text=p) for i, p in enumerate(poems)]
    for j, i in enumerate(long_ones):
        chars = list(poems[i])
        han = [k for k, ch in enumerate(chars) if "\u4e00" <= ch <= "\u9fff"]
        chars[han[len(han) // 2]] = "某"
        records.append(dict(source="u.txt", record=j, text="".join(chars)))
    found = _find_duplicates(records, DataConfig(near_dedup_threshold=0.8), tmp_path)
    assert found == [(("u.txt", j), C.DROP_NEAR_DUPLICATE) for j in range(6)]


def test_gopher_rules_keep_real_chinese_poems(chinese_poems):
    """Mean word length counts space-delimited words only: a Chinese character is not
    a 1-letter word. What is dropped is only the shortest poems (word count)."""
    from corpus.words import word_units

    config = DataConfig(quality_filter=True)
    reasons = [C.quality_reason(p, config) for p in chinese_poems]
    kept = reasons.count("")
    assert kept > 0.5 * len(chinese_poems), (kept, len(chinese_poems))
    assert set(reasons) <= {"", C.DROP_QUALITY_WORD_COUNT}
    short = [p for p, r in zip(chinese_poems, reasons, strict=True) if r]
    assert all(len(word_units(p)) < config.min_words for p in short)
    # English still gets the mean-word-length rule.
    assert C.quality_reason("a " * 60, config) == C.DROP_QUALITY_MEAN_WORD_LENGTH


# ----------------------------------------------------------------------------- SFT records

BOS = "<｜begin▁of▁sentence｜>"


def _p(user: str) -> str:
    return BOS + "User: " + user + "\n\nAssistant: "


def test_sft_record_rules():
    cfg = DataConfig(task="sft", min_chars=30, max_chars=60)
    # len(_p("Hi")) = 21 (BOS) + 6 ("User: ") + 2 + 13 ("\n\nAssistant: ") = 42 characters
    assert len(_p("Hi")) == 42
    assert C.clean_sft_record(_p("Hi"), "Hello", "", cfg) == (_p("Hi"), "Hello", C.KEPT, [])
    # the length filters count prompt + response: 42 + 5 = 47 kept; 42 + 30 = 72 > 60
    assert C.clean_sft_record(_p("Hi"), "x" * 30, "", cfg)[2] == C.DROP_TOO_LONG
    short = DataConfig(task="sft", min_chars=50)  # 47 < 50
    assert C.clean_sft_record(_p("Hi"), "Hello", "", short)[2] == C.DROP_TOO_SHORT
    assert C.clean_sft_record(_p("Hi"), "\x00 \x1b", "", cfg) == (
        "", "", C.DROP_EMPTY_RESPONSE, [C.REPAIR_NUL_BYTES, C.REPAIR_CONTROL_CHARACTERS])
    assert C.clean_sft_record("", "", "missing_prompt_field", cfg) == (
        "", "", "missing_prompt_field", [])


def test_sft_record_cleans_both_fields_and_keeps_the_template_tokens():
    cfg = DataConfig(task="sft", normalization="NFKC", redact_pii=True)
    prompt, response, reason, repairs = C.clean_sft_record(
        _p("mail me\x07 at a@b.org"), "ｆｕｌｌ, call 555-123-4567\x1b", "", cfg)
    assert reason == C.KEPT
    assert prompt == _p("mail me at <EMAIL>")  # the BOS text keeps its fullwidth bars
    assert response == "full, call <PHONE_NUMBER>"
    assert repairs == [C.REPAIR_NORMALIZED, C.REPAIR_CONTROL_CHARACTERS, "redacted_email",
                       "redacted_phone_number"]


def test_sft_quality_rules_judge_the_response():
    cfg = DataConfig(task="sft", quality_filter=True, min_words=5)
    long_prompt = _p("one two three four five six seven eight")
    assert C.clean_sft_record(long_prompt, "Yes.", "", cfg)[2] == C.DROP_QUALITY_WORD_COUNT
    answer = "Good morning to you, my dear friend and neighbour."
    assert C.clean_sft_record(_p("Hi"), answer, "", cfg)[2] == C.KEPT


def test_sft_duplicates_are_keyed_on_the_pair(shakespeare, tmp_path):
    """Exact duplicates are equal (prompt, response) pairs: the same response to another
    prompt is none. Near duplicates are judged on the pair's text: a pair whose long
    response differs in one word, and a long response repeated under another prompt."""
    from components.text_cleaner.executor import record_keys

    data = DataConfig(task="sft", near_dedup_threshold=0.8)
    speeches = [p for p in shakespeare.split("\n\n") if len(p.split()) >= 80][:10]
    records = [dict(source="s.jsonl", record=i, prompt=_p(f"Speech {i}?"), text=t)
               for i, t in enumerate(speeches)]
    records += [
        dict(source="t.jsonl", record=0, prompt=_p("Speech 0?"), text=speeches[0]),  # exact
        dict(source="t.jsonl", record=1, prompt=_p("Another question"), text=speeches[1]),
    ]
    words = speeches[2].split()
    words[len(words) // 2] = "EDITED"
    records.append(dict(source="t.jsonl", record=2, prompt=_p("Speech 2?"),
                        text=" ".join(words)))
    packed = [record_keys(r, 0, data) for r in records]
    found = _find_duplicates_packed(packed, data, tmp_path / "near")
    assert found == [(("t.jsonl", 0), C.DROP_EXACT_DUPLICATE),
                     (("t.jsonl", 1), C.DROP_NEAR_DUPLICATE),
                     (("t.jsonl", 2), C.DROP_NEAR_DUPLICATE)]
    exact_only = DataConfig(task="sft", near_dedup=False)
    packed = [record_keys(r, 0, exact_only) for r in records]
    found = _find_duplicates_packed(packed, exact_only, tmp_path / "exact")
    assert found == [(("t.jsonl", 0), C.DROP_EXACT_DUPLICATE)]
    # The pair key differs from the response's key and from another prompt's pair key.
    assert C.sft_content_key("a", "b") != C.sft_content_key("ab", "")
    assert C.sft_content_key("a", "b") != C.content_key("b")


def _find_duplicates_packed(packed, data, tmp_path, kept=False):
    """((source, record), reason) of each duplicate `_FindDuplicates` finds in `pack_keys`
    records; with `kept`, ((source_name, source, record), reason, the kept copy's
    (source_name, source, record))."""
    import apache_beam as beam

    from components.text_cleaner.dedup import FindDuplicates as _FindDuplicates
    from components.text_cleaner.dedup import parse_doc_key

    tmp_path.mkdir(exist_ok=True)
    out = str(tmp_path / "duplicates")
    with beam.Pipeline() as p:
        _ = (p | beam.Create(packed)
             | beam.io.WriteToTFRecord(str(tmp_path / "keys"))
             | _FindDuplicates(data, num_bits=1 << 16)
             | beam.Map(lambda kv: json.dumps([kv[0].hex(), kv[1][0], kv[1][1].hex()]))
             | beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    found = [json.loads(line) for line in open(out)]
    if kept:
        return sorted((parse_doc_key(bytes.fromhex(k), ["train"])[1:], reason,
                       parse_doc_key(bytes.fromhex(first), ["train"])[1:])
                      for k, reason, first in found)
    return sorted((parse_doc_key(bytes.fromhex(k), ["train"])[2:], reason)
                  for k, reason, _ in found)


def test_sft_examples_round_trip_through_the_cleaner_parser():
    from components.text_cleaner.executor import _parse, _to_example

    record = dict(split="train", text="疑是地上霜", source="a.jsonl", record=3,
                  reject_reason="", repairs=["unicode_normalized"], prompt=_p("床前明月光"),
                  source_name="poems")
    parsed = _parse(_to_example(record), "train")
    assert parsed == record
    # An example written before mixtures (no source_name) is the "default" source's.
    import tensorflow as tf

    old = tf.train.Example.FromString(_to_example(record))
    del old.features.feature["source_name"]
    assert _parse(old.SerializeToString(), "train")["source_name"] == "default"
    plain = _parse(_to_example(dict(record, prompt=None)), "train")
    assert plain["prompt"] is None


def test_a_document_in_two_sources_is_dropped_once_naming_the_kept_source(
        shakespeare, chinese_poems, tmp_path):
    """Deduplication runs across sources: a poem copied into the `web` source, exactly and
    with one character changed, is dropped there (the `poems` copy is kept: lower source
    name first) and each dropped copy names the kept one; the same file name in two
    sources is two documents."""
    poems = [p for p in dict.fromkeys(chinese_poems) if _han(p) >= 150][:4]
    speeches = [p for p in shakespeare.split("\n\n") if len(p.split()) >= 80][:4]
    records = [dict(source_name="poems", source="唐诗.txt", record=i, text=p)
               for i, p in enumerate(poems)]
    records += [dict(source_name="web", source="唐诗.txt", record=i, text=p)
                for i, p in enumerate(speeches)]
    chars = list(poems[1])
    chars[len(chars) // 2] = "某"
    records += [dict(source_name="web", source="copy.txt", record=0, text=poems[0]),
                dict(source_name="web", source="copy.txt", record=1, text="".join(chars))]
    found = _find_duplicates(records, DataConfig(near_dedup_threshold=0.8), tmp_path,
                             kept=True)
    assert found == [
        (("web", "copy.txt", 0), C.DROP_EXACT_DUPLICATE, ("poems", "唐诗.txt", 0)),
        (("web", "copy.txt", 1), C.DROP_NEAR_DUPLICATE, ("poems", "唐诗.txt", 1))]


def _counts(rows):
    """build_report's counts from (split, source, reason, n) rows."""
    return [((split, source, reason), n) for split, source, reason, n in rows]


def test_cleaning_report_counts_per_source():
    from components.text_cleaner.executor import build_report

    counts = _counts([("train", "poems", "kept", 8), ("eval", "poems", "kept", 1),
                      ("train", "poems", "too_short", 3), ("train", "web", "kept", 5),
                      ("train", "web", "exact_duplicate", 2),
                      ("train", "web", "repair:redacted_email", 1)])
    samples = [(("web", "exact_duplicate"),
                [("copy.txt", 4, ("poems", "唐诗.txt", 0)), ("copy.txt", 1, ("poems", "唐诗.txt", 2))]),
               (("poems", "too_short"), [("唐诗.txt", 9, ())])]
    report = build_report(counts, samples, ["train", "eval"], names=("web", "poems", "code"))
    assert report["total"]["read"] == 19 and report["total"]["dropped"] == 5
    assert report["by_source"]["poems"] == {
        "records_read": 12, "records_kept": 9, "records_dropped": 3,
        "dropped": {"too_short": 3}, "repaired": {},
        "rejected_samples": {"too_short": [
            {"source_name": "poems", "source": "唐诗.txt", "record": 9}]}}
    web = report["by_source"]["web"]
    assert (web["records_read"], web["records_kept"], web["dropped"], web["repaired"]) == (
        7, 5, {"exact_duplicate": 2}, {"redacted_email": 1})
    assert web["rejected_samples"]["exact_duplicate"][0] == {
        "source_name": "web", "source": "copy.txt", "record": 1,
        "kept": {"source_name": "poems", "source": "唐诗.txt", "record": 2}}
    assert report["by_source"]["code"]["records_read"] == 0  # named, without records
    # The old two-element samples stay (readers unpack `src, rec`); the full ones beside.
    assert report["rejected_samples"]["exact_duplicate"] == [["copy.txt", 1], ["copy.txt", 4]]
    assert report["rejected_records"]["exact_duplicate"][1]["kept"]["record"] == 0


def test_a_source_whose_records_are_all_rejected_stops_the_run_by_name():
    from components.text_cleaner.executor import (
        DataValidationError,
        build_report,
        check_reject_fraction,
        check_sources,
    )
    from config import DataSource

    data = DataConfig(max_reject_fraction=0.5, sources=(
        DataSource("plays", "/d/plays.txt", 9.0),
        DataSource("poems", "/d/poems.jsonl", 1.0, min_chars=500)))
    counts = _counts([("train", "plays", "kept", 90), ("train", "poems", "too_short", 6),
                      ("eval", "poems", "invalid_json", 1)])
    samples = [(("poems", "too_short"), [("poems.jsonl", 0, ())])]
    report = build_report(counts, samples, ["train", "eval"], names=("plays", "poems"))
    check_reject_fraction(report, data.max_reject_fraction)  # 7 of 97: the mixture passes
    with pytest.raises(DataValidationError) as e:
        check_sources(report, data)
    message = str(e.value)
    assert message.startswith("data source 'poems': 7 of 7 records rejected (all rejected)")
    assert "too_short: 6 (e.g. poems.jsonl record 0)" in message
    assert "invalid_json: 1" in message
    # Its own max_reject_fraction, not the mixture's: 3 of 10 passes 0.5 but not 0.2.
    counts = _counts([("train", "plays", "kept", 90), ("train", "poems", "kept", 7),
                      ("train", "poems", "too_short", 3)])
    report = build_report(counts, [], ["train"], names=("plays", "poems"))
    check_sources(report, data)
    strict = DataConfig(max_reject_fraction=0.5, sources=(
        data.sources[0], DataSource("poems", "/d/poems.jsonl", max_reject_fraction=0.2)))
    with pytest.raises(DataValidationError, match=r"^data source 'poems': 3 of 10 records "
                       r"rejected \(30\.0% > its max_reject_fraction=20\.0%\)"):
        check_sources(report, strict)
    report = build_report(_counts([("train", "plays", "kept", 9)]), [], ["train"],
                          names=("plays", "poems"))
    with pytest.raises(DataValidationError, match="data source 'poems' has no records"):
        check_sources(report, data)
    check_sources(report, DataConfig())  # one source: the total's check only
