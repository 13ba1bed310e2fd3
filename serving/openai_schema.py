"""The request bodies of the OpenAI-compatible endpoints (`serving/openai_api.py`), typed.

Field names, defaults and ranges are OpenAI's (API reference, "Completions" (legacy) and
"Chat Completions"), with these limits of this server:

  - every number is strict: a boolean or a string is refused where a number belongs, an
    integer is checked against int32 before any tensor is built, a float must be finite;
  - unknown fields are refused by name (400); the OpenAI fields in `IGNORED_FIELDS` are
    accepted and ignored (they ask for storage or billing this server does not have);
  - `n` (1 to 128, and at most the decode slots) and `logit_bias` (at most 300 token ids,
    each bias in [-100, 100]) need the serving engine; `best_of` must be 1;
    `frequency_penalty` and `presence_penalty` must be 0; `suffix` (fill in the middle)
    needs DeepSeek's FIM tokens; `tools` / `tool_choice` / `functions` absent and
    `response_format` `{"type": "text"}`: the model has no such controls;
  - `top_k` (an int >= 0, 0 = no top-k filter) is accepted as an extension, as vLLM does.

`model_validate_json` parses the raw body (pydantic's own JSON parser: a nesting depth
limit, no NaN) and checks it in one step; `parse` turns its errors into one line naming
the field (`RequestError`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# OpenAI takes up to 4 stop sequences; lm-evaluation-harness's `local-completions` sends a
# generation task's whole `until` list, so more are accepted here (a bounded extension,
# as vLLM's), each at most MAX_STOP_CHARS characters.
MAX_STOP = 32
MAX_STOP_CHARS = 1024
MAX_LOGPROBS = 5  # completions: OpenAI's largest `logprobs`
MAX_TOP_LOGPROBS = 20  # chat: OpenAI's largest `top_logprobs`
MAX_NAME_CHARS = 64  # OpenAI's longest function and schema name
MAX_TOOLS = 128  # OpenAI's most tools per request
MAX_N = 128  # choices per prompt; the engine's free decode slots bound it further
MAX_LOGIT_BIAS = 300  # OpenAI's most logit_bias entries
# OpenAI fields that are accepted and have no effect here (no storage, no tiers).
IGNORED_FIELDS = ("store", "metadata", "service_tier", "name")

Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


class RequestError(ValueError):
    """A request body that does not validate: `param` names the field (OpenAI's `param`,
    e.g. "messages[0].content"), the message says what is wrong with it."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields both endpoints share."""

    model: str | None = None  # None: the server's default model
    max_tokens: Count | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: Count = 0  # extension (vLLM's): 0 = no top-k filter
    stop: Any = Field(default=None, validate_default=True)  # -> list[str]
    seed: Int32 | None = None
    n: Count = 1
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    logit_bias: dict[str, Any] | None = None
    # accepted, ignored (IGNORED_FIELDS)
    store: Any = None
    metadata: Any = None
    service_tier: Any = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        """str | list[str] (1 to MAX_STOP non-empty strings of at most MAX_STOP_CHARS
        characters) | None -> list[str]."""
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("must be a string or a list of strings")
        if len(stops) > MAX_STOP or not all(stops) or max(map(len, stops)) > MAX_STOP_CHARS:
            raise ValueError(f"must be at most {MAX_STOP} non-empty strings of at most "
                             f"{MAX_STOP_CHARS} characters")
        return stops

    @field_validator("n")
    @classmethod
    def _n(cls, value):
        if not 1 <= value <= MAX_N:
            raise ValueError(f"n={value} must be in [1, {MAX_N}] (and at most the free "
                             "decode slots)")
        return value

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value):
        if value != 0:
            raise ValueError("must be 0: the model has no repetition penalties")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        """{"token id": bias}: at most MAX_LOGIT_BIAS entries, each bias a finite number
        in [-100, 100] (OpenAI's); the ids are checked against the model's vocabulary
        later."""
        if not value:
            return value
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"has {len(value)} entries; at most {MAX_LOGIT_BIAS}")
        for key, bias in value.items():
            if (not isinstance(bias, int | float) or isinstance(bias, bool)
                    or not -100 <= bias <= 100):
                raise ValueError(f"[{key!r}] must be a number in [-100, 100] (got {bias!r})")
        return value


class CompletionRequest(_Sampling):
    """POST /v1/completions. `prompt`: a string, a list of strings, a list of token ids
    (one prompt) or a list of lists of token ids; normalized by `parse_prompt`."""

    prompt: Any
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Count = 1
    suffix: str | None = None  # fill in the middle: needs DeepSeek's FIM tokens

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        if value != 1:
            raise ValueError(f"best_of={value}: only best_of=1 is supported")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        """-> list[str] or list[list[int]], one entry per prompt, not empty."""
        def is_id(x):
            return isinstance(x, int) and not isinstance(x, bool)

        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value:
            if all(isinstance(p, str) for p in value):
                return value
            if all(is_id(t) for t in value):
                return [value]
            if all(isinstance(p, list) and p and all(is_id(t) for t in p) for p in value):
                return value
        raise ValueError("must be a string, a non-empty list of strings, a non-empty list "
                         "of token ids, or a list of non-empty lists of token ids")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = Field(default=None, validate_default=True)
    name: str | None = None  # accepted, ignored
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    reasoning_content: str | None = None  # assistant (DeepSeek's API)
    prefix: bool = False  # the last assistant message: chat prefix completion (DeepSeek's)

    @field_validator("content")
    @classmethod
    def _content(cls, value):
        """str | [{"type": "text", "text": str}, ...] | None -> str (the parts joined;
        None as "", for an assistant message with tool_calls)."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            try:
                return "".join(TextPart.model_validate(p).text for p in value)
            except ValidationError:
                pass
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts '
                         "(the model reads text only)")


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)] = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Function(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS,
                               pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: Function


class Thinking(_Strict):
    type: Literal["enabled", "disabled"]


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", ...}
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None  # False: a forced call is exactly one
    thinking: Thinking | None = None  # DeepSeek's API
    reasoning_effort: Literal["low", "medium", "high", "max"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and SGLang's

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, value):
        if value is not None:
            raise ValueError("is not supported (OpenAI's deprecated form): use tools and "
                             "tool_choice")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        """None | "none" | "auto" | "required" | {"type": "function", "function":
        {"name": str}}."""
        if value is None or value in ("none", "auto", "required"):
            return value
        if (isinstance(value, dict) and value.get("type") == "function"
                and isinstance(value.get("function"), dict)
                and isinstance(value["function"].get("name"), str) and len(value) == 2):
            return value
        raise ValueError('must be "none", "auto", "required" or {"type": "function", '
                         '"function": {"name": ...}}')


def _param(loc: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content" (OpenAI's `param` form)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse(model: type[BaseModel], body: bytes) -> Any:
    """`model` validated from the raw JSON `body`.

    Raises:
      RequestError: the body is not JSON, not an object, or a field is missing, unknown,
        of the wrong type or out of range; the first such field is named.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        param = _param(error["loc"])
        kind, message = error["type"], error["msg"].removeprefix("Value error, ")
        if kind == "json_invalid":
            raise RequestError(f"the body is not valid JSON: {message}") from None
        if kind == "model_type" and not error["loc"]:
            raise RequestError("the body must be a JSON object") from None
        if kind == "extra_forbidden":
            raise RequestError(f"unknown field '{param}' (fields accepted but ignored: "
                               f"{', '.join(IGNORED_FIELDS)})", param) from None
        if kind == "missing":
            raise RequestError(f"'{param}' is required", param) from None
        given = error.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {given!r})"
        raise RequestError(f"'{param}' {message[0].lower()}{message[1:]}{shown}",
                           param) from None
