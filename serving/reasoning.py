"""DeepSeek's thinking split: a reply's `reasoning_content` apart from its `content`.

In thinking mode the prompt ends in "<think>" (DeepSeek-R1, V3.1, V3.2, and V4's
`<｜Assistant｜><think>`, tokenization/deepseek_v4_chat.py), so the reply starts inside
its reasoning:

    reply = reasoning + "</think>" + content

Two departures from that shape are handled as vLLM handles them:

  - a stray "<think>" at the very start of the reply is dropped (vLLM's deepseek_r1
    parser; R1 once wrote it itself);
  - V4 sometimes opens its tool calls without closing its reasoning (vLLM's deepseek_v4
    parser, seen at ~100K-token contexts): "<｜DSML｜tool_calls>" before any "</think>"
    ends the reasoning too, and stays at the head of `content` for the tool-call parser.

A reply that never ends its reasoning (cut off by max_tokens) is all reasoning, as in
vLLM. Nothing is lost or repeated: with `dropped_start` and `end` as the splitter leaves
them,

    reply == ("<think>" if dropped_start else "") + reasoning
             + ("</think>" if end == "</think>" else "") + content

In chat mode (`thinking=False`: the prompt ended in "</think>") the reply is all content.

Sources:
  - vLLM vllm/reasoning/deepseek_r1_reasoning_parser.py at commit
    d5c95556302c4f4fdae9e2aef9d03548e1b1f678 (`extract_reasoning_content`: partition on
    "<think>", then on "</think>"; no "</think>": all reasoning). vLLM drops the first
    "<think>" anywhere in the reply, with any text before it; here only a leading one.
  - vLLM vllm/reasoning/deepseek_v4_reasoning_parser.py at commit
    69d83f5571400f2ddeae834045e403457a632102 (`_DSV4_TOOL_CALL_IMPLICIT_END_MARKERS`).
  - DeepSeek-V4's encoding_dsv4.py `parse_message_from_completion_text` (SGLang's copy,
    python/sglang/srt/entrypoints/openai/encoding_dsv4.py at commit
    00370f2784265e663d500abcc6a59b13854840f5): reasoning is the text before "</think>".
"""

from __future__ import annotations

from collections.abc import Sequence

THINK_START = "<think>"
THINK_END = "</think>"
# vLLM deepseek_v4's implicit end of reasoning: V4's tool-call block opening.
V4_IMPLICIT_END_MARKERS = ("<｜DSML｜tool_calls>",)


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`
    (what a streaming parser holds back: it may be the start of `marker`)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _first_end(text: str, ends: Sequence[str]) -> tuple[int, str | None]:
    """(position, marker) of the earliest of `ends` in `text`; (-1, None) if none."""
    best, found = -1, None
    for marker in ends:
        pos = text.find(marker)
        if pos >= 0 and (best < 0 or pos < best):
            best, found = pos, marker
    return best, found


def split_reasoning(text: str, thinking: bool = True,
                    implicit_end_markers: Sequence[str] = V4_IMPLICIT_END_MARKERS
                    ) -> tuple[str, str]:
    """A whole reply as (reasoning, content), the format in the module docstring.

    Args:
      text: the decoded reply (special tokens kept as text).
      thinking: the prompt ended in "<think>"; False: chat mode, all content.
      implicit_end_markers: text that ends the reasoning when it comes before "</think>"
        and stays in the content (default V4's "<｜DSML｜tool_calls>"; () for R1).
    """
    if not thinking:
        return "", text
    if text.startswith(THINK_START):
        text = text[len(THINK_START):]
    pos, marker = _first_end(text, (THINK_END, *implicit_end_markers))
    if marker is None:
        return text, ""
    if marker == THINK_END:
        return text[:pos], text[pos + len(THINK_END):]
    return text[:pos], text[pos:]


class ReasoningSplitter:
    """`split_reasoning` for a reply that arrives in pieces (decoded text deltas).

    `push(piece)` returns the (reasoning, content) text it can tell apart so far, holding
    back an unfinished "</think>" (or marker, or leading "<think>") across pieces, e.g.
    "</th" then "ink>"; `finish()` returns what is still held. The deltas of all calls,
    concatenated, are `split_reasoning` of the whole reply.

    Args:
      thinking: the prompt ended in "<think>"; False: chat mode, every piece is content.
      implicit_end_markers: as for `split_reasoning`.

    Attributes:
      dropped_start: a leading "<think>" was dropped.
      end: "</think>", the implicit marker that ended the reasoning, or None (not yet, or
        never: a reply cut off while reasoning).

    Raises:
      RuntimeError: `push` or `finish` after `finish`.
    """

    def __init__(self, thinking: bool = True,
                 implicit_end_markers: Sequence[str] = V4_IMPLICIT_END_MARKERS):
        self.thinking = thinking
        self.implicit_end_markers = tuple(implicit_end_markers)
        self.dropped_start = False
        self.end: str | None = None
        self._at_start = thinking  # a leading "<think>" may still come
        self._in_reasoning = thinking
        self._held = ""
        self._finished = False

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning_delta, content_delta) for one more piece of the reply."""
        self._check_open()
        if not self._in_reasoning:
            return "", text
        self._held += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """(reasoning_delta, content_delta): what was held back, the reply being complete."""
        self._check_open()
        self._finished = True
        if not self._in_reasoning:
            return "", ""
        return self._advance(final=True)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("ReasoningSplitter: the reply was finished already")

    def _advance(self, final: bool) -> tuple[str, str]:
        """Splits the held text; keeps what may still become a marker unless `final`."""
        text = self._held
        if self._at_start:
            if text.startswith(THINK_START):
                text, self.dropped_start = text[len(THINK_START):], True
            elif THINK_START.startswith(text) and not final:
                return "", ""  # "", "<", "<th", ...: maybe a leading "<think>"
            self._at_start = False
        ends = (THINK_END, *self.implicit_end_markers)
        pos, marker = _first_end(text, ends)
        if marker is not None:
            self._held, self._in_reasoning, self.end = "", False, marker
            after = pos + len(THINK_END) if marker == THINK_END else pos
            return text[:pos], text[after:]
        keep = 0 if final else max(partial_suffix(text, end) for end in ends)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], ""
