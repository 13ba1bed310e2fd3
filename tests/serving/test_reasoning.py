"""DeepSeek's thinking split (`serving/reasoning.py`): reasoning_content apart from content,
whole (`split_reasoning`) and streamed (`ReasoningSplitter`), cut at every position."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.reasoning import (
    THINK_END,
    THINK_START,
    V4_IMPLICIT_END_MARKERS,
    ReasoningSplitter,
    partial_suffix,
    split_reasoning,
)

DSML_OPEN = V4_IMPLICIT_END_MARKERS[0]  # "<｜DSML｜tool_calls>"

# (reply, reasoning, content) by hand; thinking mode, V4's markers.
CASES = [
    ("用户问北京的天气，我先想一想。</think>北京今天晴，22°C。", "用户问北京的天气，我先想一想。",
     "北京今天晴，22°C。"),
    ("<think>嗯，床前明月光。</think>\n\n疑是地上霜。", "嗯，床前明月光。", "\n\n疑是地上霜。"),
    ("no end: cut off while reasoning </th", "no end: cut off while reasoning </th", ""),
    ("</think>", "", ""),
    ("", "", ""),
    ("<think>", "", ""),
    ("<thin", "<thin", ""),
    ("x<think>y</think>z", "x<think>y", "z"),  # only a leading "<think>" is dropped
    ("a</think>b</think>c", "a", "b</think>c"),  # the first "</think>" ends the reasoning
    ("要查天气。\n\n" + DSML_OPEN + "\n<｜DSML｜invoke", "要查天气。\n\n",
     DSML_OPEN + "\n<｜DSML｜invoke"),  # V4's implicit end: the marker stays in content
    ("想</think>答" + DSML_OPEN, "想", "答" + DSML_OPEN),
    ("<<</</t</think>>", "<<</</t", ">"),
    ("🌸👨‍👩‍👧</think>👍🏽", "🌸👨‍👩‍👧", "👍🏽"),
]


_IDS = [f"case{i}" for i in range(len(CASES))]


def _rebuilt(splitter: ReasoningSplitter, reasoning: str, content: str) -> str:
    """The reply, put back together from the split and what the splitter dropped."""
    return ((THINK_START if splitter.dropped_start else "") + reasoning
            + (THINK_END if splitter.end == THINK_END else "") + content)


def _stream(text: str, cuts: list[int], **kwargs) -> tuple[str, str, ReasoningSplitter]:
    """`text` pushed in the pieces between `cuts` (sorted positions), then finished."""
    splitter = ReasoningSplitter(**kwargs)
    reasoning, content = [], []
    bounds = [0, *cuts, len(text)]
    for start, stop in zip(bounds, bounds[1:], strict=False):
        r, c = splitter.push(text[start:stop])
        reasoning.append(r)
        content.append(c)
    r, c = splitter.finish()
    return "".join(reasoning) + r, "".join(content) + c, splitter


@pytest.mark.parametrize("text, reasoning, content", CASES, ids=_IDS)
def test_split_by_hand(text, reasoning, content):
    assert split_reasoning(text) == (reasoning, content)
    got_reasoning, got_content, splitter = _stream(text, [])
    assert (got_reasoning, got_content) == (reasoning, content)
    assert _rebuilt(splitter, reasoning, content) == text


@pytest.mark.parametrize("text, reasoning, content", CASES, ids=_IDS)
def test_every_cut_and_every_pair_of_cuts(text, reasoning, content):
    """Pieces cut at any one or two character positions give the same split, and the
    reply comes back byte for byte."""
    n = len(text)
    for i in range(n + 1):
        for j in range(i, n + 1):
            got_reasoning, got_content, splitter = _stream(text, [i, j])
            assert (got_reasoning, got_content) == (reasoning, content), (i, j)
            assert _rebuilt(splitter, got_reasoning, got_content) == text


def test_one_character_at_a_time():
    text = "<think>让我想想：先看</thin>、再看</think>答案是四十二。"
    assert _stream(text, list(range(1, len(text))))[:2] == (
        "让我想想：先看</thin>、再看", "答案是四十二。")


def test_a_partial_end_is_held_across_pieces():
    splitter = ReasoningSplitter()
    assert splitter.push("推理中</th") == ("推理中", "")
    assert splitter.push("ink>答") == ("", "答")
    assert splitter.end == THINK_END
    assert splitter.push("案") == ("", "案")
    assert splitter.finish() == ("", "")


def test_a_held_prefix_that_is_not_an_end_is_reasoning():
    splitter = ReasoningSplitter()
    assert splitter.push("a</thi") == ("a", "")
    assert splitter.push("s") == ("</this", "")
    assert splitter.push("<") == ("", "")
    assert splitter.finish() == ("<", "")
    assert splitter.end is None and not splitter.dropped_start


def test_leading_think_is_held_until_known():
    splitter = ReasoningSplitter()
    assert splitter.push("<") == ("", "")
    assert splitter.push("thi") == ("", "")
    assert splitter.push("nk>想") == ("想", "")
    assert splitter.dropped_start
    other = ReasoningSplitter()
    assert other.push("<") == ("", "")
    assert other.push("/think>x") == ("", "x")  # it was an end, not a start
    assert not other.dropped_start


def test_chat_mode_is_all_content():
    text = "<think>a</think>b" + DSML_OPEN
    assert split_reasoning(text, thinking=False) == ("", text)
    splitter = ReasoningSplitter(thinking=False)
    assert splitter.push(text[:5]) == ("", text[:5])
    assert splitter.push(text[5:]) == ("", text[5:])
    assert splitter.finish() == ("", "")


def test_r1_has_no_implicit_end():
    text = "想" + DSML_OPEN + "x</think>y"
    assert split_reasoning(text, implicit_end_markers=()) == ("想" + DSML_OPEN + "x", "y")
    assert _stream(text, [2, 5], implicit_end_markers=())[:2] == ("想" + DSML_OPEN + "x", "y")
    splitter = _stream(text, [3])[2]
    assert splitter.end == DSML_OPEN


def test_finished_splitter_refuses_more():
    splitter = ReasoningSplitter()
    splitter.finish()
    with pytest.raises(RuntimeError, match="finished already"):
        splitter.push("x")
    with pytest.raises(RuntimeError, match="finished already"):
        splitter.finish()


def test_partial_suffix():
    assert partial_suffix("abc</th", THINK_END) == 4
    assert partial_suffix("abc", THINK_END) == 0
    assert partial_suffix("</think>", THINK_END) == 0  # whole markers are found, not held
    assert partial_suffix("<<", "<<<") == 2


_PIECES = ["<think>", "</think>", "<", "</", "</th", "think>", ">", DSML_OPEN, DSML_OPEN[:6],
           "北京", "\n\n", "a", "🌸"]
_REPLIES = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=3)),
                    max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(_REPLIES, st.lists(st.integers(0, 60), max_size=6), st.booleans(), st.booleans())
def test_streamed_equals_whole(text, cuts, thinking, v4_markers):
    markers = V4_IMPLICIT_END_MARKERS if v4_markers else ()
    cuts = sorted(min(c, len(text)) for c in cuts)
    reasoning, content, splitter = _stream(text, cuts, thinking=thinking,
                                           implicit_end_markers=markers)
    assert (reasoning, content) == split_reasoning(text, thinking, markers)
    assert _rebuilt(splitter, reasoning, content) == text
