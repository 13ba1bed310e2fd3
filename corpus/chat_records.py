"""Supervised fine-tuning, preference (DPO) and GRPO records -> `Document`s: the prompt
fields or chat turns checked and rendered by the chat template, the responses
normalized, each unusable record with its reject reason (the record forms and their
reasons: `corpus/documents.py`).
"""

from __future__ import annotations

from typing import Any

from config import DataConfig
from corpus.document_record import (
    REJECT_ANSWER_NOT_STRING,
    REJECT_CHAT_TEMPLATE,
    REJECT_CHAT_TEMPLATE_LIMIT,
    REJECT_CHOSEN_EQUALS_REJECTED,
    REJECT_CHOSEN_NOT_STRING,
    REJECT_EMPTY_ANSWER,
    REJECT_EMPTY_CHOSEN,
    REJECT_EMPTY_PROMPT,
    REJECT_EMPTY_REJECTED,
    REJECT_EMPTY_RESPONSE,
    REJECT_INVALID_MESSAGES,
    REJECT_MISSING_ANSWER_FIELD,
    REJECT_MISSING_CHOSEN_FIELD,
    REJECT_MISSING_PROMPT_FIELD,
    REJECT_MISSING_REJECTED_FIELD,
    REJECT_MISSING_RESPONSE_FIELD,
    REJECT_NOT_AN_OBJECT,
    REJECT_PROMPT_NOT_STRING,
    REJECT_REJECTED_NOT_STRING,
    REJECT_RESPONSE_NOT_STRING,
    REPAIR_NORMALIZED,
    TRL_PROMPT_FIELD,
    Document,
)
from tokenization.chat_template import (
    ChatFormat,
    ChatTemplateError,
    ChatTemplateLimitError,
)


def _sft_reject(source: str, record: int, reason: str) -> Document:
    return Document("", source, record, reason, prompt="")


def record_reject(task: str, source: str, record: int, reason: str) -> Document:
    """A rejected SFT/GRPO record (`prompt` ""), or DPO record (`prompt`, `rejected` "")."""
    return Document("", source, record, reason, prompt="",
                    rejected="" if task == "dpo" else None)


def _valid_messages(messages: Any) -> bool:
    return (isinstance(messages, list) and len(messages) >= 2
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in messages)
            and messages[-1]["role"] == "assistant")


def sft_document(obj: Any, source: str, record: int, config: DataConfig,
                 chat: ChatFormat) -> Document:
    """One SFT record (a parsed JSON object, CSV row or Parquet row) -> Document.

    With `config.messages_field` present (not null), the record is a chat: its
    last message is the response and the turns before it the prompt. Otherwise
    `config.prompt_field` is one user turn and `config.response_field` the
    response. Contents are normalized (`config.normalization`) before the turns
    are rendered with `chat`.

    Returns:
      `Document(text=response, prompt=rendered prompt)`, or a rejected one
      (`prompt=""`) with one of the SFT reject reasons of this module.
    """
    from corpus.cleaning import normalize

    if not isinstance(obj, dict):
        return _sft_reject(source, record, REJECT_NOT_AN_OBJECT)
    form = config.normalization
    messages = obj.get(config.messages_field)
    if messages is not None:
        if not _valid_messages(messages):
            return _sft_reject(source, record, REJECT_INVALID_MESSAGES)
        turns = [dict(m, content=normalize(m["content"], form)) for m in messages]
        turns, response = turns[:-1], turns[-1]["content"]
        raw = [m["content"] for m in messages]
    else:
        prompt, response = obj.get(config.prompt_field), obj.get(config.response_field)
        if prompt is None:
            return _sft_reject(source, record, REJECT_MISSING_PROMPT_FIELD)
        if response is None:
            return _sft_reject(source, record, REJECT_MISSING_RESPONSE_FIELD)
        if not isinstance(prompt, str):
            return _sft_reject(source, record, REJECT_PROMPT_NOT_STRING)
        if not isinstance(response, str):
            return _sft_reject(source, record, REJECT_RESPONSE_NOT_STRING)
        if not prompt.strip():
            return _sft_reject(source, record, REJECT_EMPTY_PROMPT)
        raw = [prompt, response]
        turns = [{"role": "user", "content": normalize(prompt, form)}]
        response = normalize(response, form)
    if not response.strip():
        return _sft_reject(source, record, REJECT_EMPTY_RESPONSE)
    try:
        rendered = chat.render(turns)
    except ChatTemplateLimitError:
        return _sft_reject(source, record, REJECT_CHAT_TEMPLATE_LIMIT)
    except ChatTemplateError:
        return _sft_reject(source, record, REJECT_CHAT_TEMPLATE)
    changed = [m["content"] for m in turns] + [response] != raw
    return Document(response, source, record, repairs=(REPAIR_NORMALIZED,) if changed else (),
                    prompt=rendered)


def _prompt_turns(obj: dict, config: DataConfig) -> tuple[list[dict], list[str], str]:
    """The prompt of a DPO or GRPO record: (normalized turns, their raw contents, "") or
    ([], [], reject reason). `config.messages_field` (the whole chat) wins when present;
    else `config.prompt_field`, or "prompt" when the record has no such key."""
    from corpus.cleaning import normalize

    form = config.normalization
    messages = obj.get(config.messages_field)
    if messages is not None:
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str) for m in messages)
                and messages[-1]["role"] != "assistant"):
            return [], [], REJECT_INVALID_MESSAGES
        turns = [dict(m, content=normalize(m["content"], form)) for m in messages]
        return turns, [m["content"] for m in messages], ""
    field = config.prompt_field if config.prompt_field in obj else TRL_PROMPT_FIELD
    prompt = obj.get(field)
    if prompt is None:
        return [], [], REJECT_MISSING_PROMPT_FIELD
    if not isinstance(prompt, str):
        return [], [], REJECT_PROMPT_NOT_STRING
    if not prompt.strip():
        return [], [], REJECT_EMPTY_PROMPT
    return [{"role": "user", "content": normalize(prompt, form)}], [prompt], ""


def _responses(obj: dict, config: DataConfig,
               fields: tuple[tuple[str, str, str, str], ...]) -> tuple[list[str], list[str], str]:
    """The response strings of a record: (normalized, raw, "") or ([], [], reason).
    `fields`: (field, missing reason, not-a-string reason, empty reason) per response,
    each check over all of them before the next."""
    from corpus.cleaning import normalize

    values = [obj.get(field) for field, _, _, _ in fields]
    for value, (_, missing, _, _) in zip(values, fields, strict=True):
        if value is None:
            return [], [], missing
    for value, (_, _, not_string, _) in zip(values, fields, strict=True):
        if not isinstance(value, str):
            return [], [], not_string
    normalized = [normalize(v, config.normalization) for v in values]
    for value, (_, _, _, empty) in zip(normalized, fields, strict=True):
        if not value.strip():
            return [], [], empty
    return normalized, values, ""


def _rendered(turns: list[dict], chat: ChatFormat) -> tuple[str, str]:
    """(the prompt rendered by the chat template, "") or ("", reject reason)."""
    try:
        return chat.render(turns), ""
    except ChatTemplateLimitError:
        return "", REJECT_CHAT_TEMPLATE_LIMIT
    except ChatTemplateError:
        return "", REJECT_CHAT_TEMPLATE


def dpo_document(obj: Any, source: str, record: int, config: DataConfig,
                 chat: ChatFormat) -> Document:
    """One DPO record (a parsed JSON object, CSV row or Parquet row) -> Document.

    The prompt is `config.messages_field` (a chat whose last turn is not the
    assistant's), else `config.prompt_field` (or "prompt", TRL's key, when the record
    has no such key) as one user turn; `config.chosen_field` and
    `config.rejected_field` are the two responses. Contents are normalized
    (`config.normalization`) before the turns are rendered with `chat`.

    Returns:
      `Document(text=chosen, prompt=rendered prompt, rejected=rejected)`, or a
      rejected one (`text`, `prompt`, `rejected` all "") with one of the DPO reject
      reasons of this module (the chosen and rejected responses equal after
      normalization: `chosen_equals_rejected`).
    """
    if not isinstance(obj, dict):
        return record_reject("dpo", source, record, REJECT_NOT_AN_OBJECT)
    turns, raw, reason = _prompt_turns(obj, config)
    responses, raw_responses, rendered = [], [], ""
    if not reason:
        responses, raw_responses, reason = _responses(obj, config, (
            (config.chosen_field, REJECT_MISSING_CHOSEN_FIELD, REJECT_CHOSEN_NOT_STRING,
             REJECT_EMPTY_CHOSEN),
            (config.rejected_field, REJECT_MISSING_REJECTED_FIELD, REJECT_REJECTED_NOT_STRING,
             REJECT_EMPTY_REJECTED)))
    if not reason and responses[0] == responses[1]:
        reason = REJECT_CHOSEN_EQUALS_REJECTED
    if not reason:
        rendered, reason = _rendered(turns, chat)
    if reason:
        return record_reject("dpo", source, record, reason)
    chosen, rejected = responses
    changed = [m["content"] for m in turns] + responses != raw + raw_responses
    return Document(chosen, source, record, repairs=(REPAIR_NORMALIZED,) if changed else (),
                    prompt=rendered, rejected=rejected)


def grpo_document(obj: Any, source: str, record: int, config: DataConfig,
                  chat: ChatFormat) -> Document:
    """One GRPO record (a parsed JSON object, CSV row or Parquet row) -> Document.

    The prompt as in `dpo_document`; `config.answer_field` is the reference answer,
    normalized like a response.

    Returns:
      `Document(text=answer, prompt=rendered prompt)`, or a rejected one (`prompt=""`)
      with one of the GRPO reject reasons of this module.
    """
    if not isinstance(obj, dict):
        return record_reject("grpo", source, record, REJECT_NOT_AN_OBJECT)
    turns, raw, reason = _prompt_turns(obj, config)
    answers, raw_answers, rendered = [], [], ""
    if not reason:
        answers, raw_answers, reason = _responses(obj, config, (
            (config.answer_field, REJECT_MISSING_ANSWER_FIELD, REJECT_ANSWER_NOT_STRING,
             REJECT_EMPTY_ANSWER),))
    if not reason:
        rendered, reason = _rendered(turns, chat)
    if reason:
        return record_reject("grpo", source, record, reason)
    changed = [m["content"] for m in turns] + answers != raw + raw_answers
    return Document(answers[0], source, record,
                    repairs=(REPAIR_NORMALIZED,) if changed else (), prompt=rendered)

