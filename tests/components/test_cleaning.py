"""Cleaning rules, one reason each."""

from __future__ import annotations

from components.text_cleaner import cleaning as C
from pipeline.configs import DataConfig


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


def test_near_duplicates_are_removed_and_distinct_documents_kept(shakespeare):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from components.text_cleaner.executor import _RemoveNearDuplicates

    # Speeches of >= 80 words: one edited word changes at most 5 of their >= 76
    # 5-gram shingles, so an edited copy has Jaccard >= 71/81 = 0.877 with its original.
    paragraphs = [p for p in shakespeare.split("\n\n") if len(p.split()) >= 80][:60]
    assert len(paragraphs) == 60
    records = [dict(split="train", source="s.txt", record=i, text=p, repairs=[])
               for i, p in enumerate(paragraphs)]
    # Plant near-duplicates: small edits of the first five paragraphs, later in the corpus.
    for i in range(5):
        words = paragraphs[i].split()
        words[len(words) // 2] = "EDITED"
        records.append(dict(split="train", source="t.txt", record=i, text=" ".join(words),
                            repairs=[]))
    with beam.Pipeline() as p:
        out = (p | beam.Create(records)
               | _RemoveNearDuplicates(DataConfig(near_dedup_threshold=0.8)))
        assert_that(out.dropped | "DroppedKeys" >> beam.Map(
            lambda r: (r["source"], r["record"], r["reason"])),
            equal_to([("t.txt", i, C.DROP_NEAR_DUPLICATE) for i in range(5)]), label="dropped")
        assert_that(out.kept | "KeptKeys" >> beam.Map(lambda r: (r["source"], r["record"])),
                    equal_to([("s.txt", i) for i in range(60)]), label="kept")
