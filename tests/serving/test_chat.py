"""`deepseek-tfx chat` (`serving/chat.py`): replies streamed token by token over the latent
KV cache equal the `generate` signature's, text is whole UTF-8 in any language, and the
history keeps within the context.

Subject: one tiny model (one dense block, no MTP, 64 positions, the 300-token vocabulary of
a tokenizer learned from a few units, which splits most Chinese characters into byte
tokens), talked to as a plain language model and as a chat model (DeepSeek's template in
its tokenizer_config.json). Module-scoped: one `ChatSession` per kind (its compiled step is
traced once; each test `reset()`s it) and one in-memory `savedmodel.export.ServingModule` per
kind, whose `generate` and `detokenize` are the very tf.functions `save_text_model` exports
as the signatures (`models.deepseek.generation.generate` on the same prompt ids, then the
encoder's decode), so no SavedModel export is needed here. `from_dir` and the `chat`
command run on a SavedModel of the model's variables with the tokenizer and the
assets.extra files beside it. The exported signatures themselves and `chat` from a pipe
are checked end to end: tests/e2e/test_chat_e2e.py (the shared run's plain model) and
tests/e2e/test_sft_e2e.py (a chat model)."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import sys
import types

import pytest
import tensorflow as tf

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "ROMEO": 6, ":": 9, "\n": 30, "你好": 6, "世界": 5, "。": 10, ",": 20, "😀": 4}
VOCAB = 300  # the tokenizer's size: every id the model samples is a token
CONTEXT, NEW = 64, 8  # max_position_embeddings; the models' default max_new_tokens
DEFAULTS = dict(temperature=0.9, top_k=20, top_p=0.9)  # the models' other defaults
PROMPTS = ["ROMEO:", "the quick brown fox", "床前明月光，疑是地上霜。", "你好世界😀", ""]


@pytest.fixture(scope="module")
def subject(tmp_path_factory):
    import keras
    import tensorflow_text  # noqa: F401

    from config import GenerationConfig, get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from savedmodel.export import ServingModule
    from serving.chat import ChatSession, Sampling
    from tokenization import chat_template
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    keras.utils.set_random_seed(5)
    learned = learn(UNITS, VOCAB).json
    template = chat_template.DEFAULT_CHAT_TEMPLATE
    tokenizers = {"plain": ByteLevelBpe(learned),
                  "chat": ByteLevelBpe(learned, tokenizer_config={"chat_template": template})}
    assert len(tokenizers["plain"].surfaces()) == VOCAB
    affixes = {"plain": None, "chat": chat_template.prompt_affixes(
        template, *chat_template.special_tokens(tokenizers["chat"]))}
    config = dataclasses.replace(get_config("tiny").model, vocab_size=VOCAB,
                                 max_position_embeddings=CONTEXT, num_hidden_layers=1,
                                 num_nextn_predict_layers=0)
    model = DeepSeekCausalLM(config)
    generation = GenerationConfig(max_new_tokens=NEW, **DEFAULTS)
    sampling = Sampling(NEW, **DEFAULTS)
    modules, sessions = {}, {}
    for kind, tokenizer in tokenizers.items():
        assets = tmp_path_factory.mktemp(f"{kind}_assets")
        tokenizer.write(str(assets))
        modules[kind] = ServingModule(model, tokenizer, generation, str(assets), affixes[kind])
        sessions[kind] = ChatSession(model, tokenizer, sampling, affixes[kind])
    return types.SimpleNamespace(model=model, config=config, tokenizers=tokenizers,
                                 affixes=affixes, generation=generation, sampling=sampling,
                                 modules=modules, sessions=sessions)


def _session(subject, kind, **knobs):
    """The module's session of `kind`, reset, with the models' defaults but `knobs`."""
    session = subject.sessions[kind]
    session.sampling = dataclasses.replace(subject.sampling, **knobs)
    session.reset()
    return session


def _generate(module, prompt, max_new_tokens, temperature, top_k, top_p, seed):
    """The `generate` signature's completion (the exported tf.function, in memory)."""
    out = module.generate(prompt=tf.constant([prompt]),
                          max_new_tokens=tf.constant([max_new_tokens]),
                          temperature=tf.constant([temperature], tf.float32),
                          top_k=tf.constant([top_k]), top_p=tf.constant([top_p], tf.float32),
                          seed=tf.constant([seed]))
    return out["completion"][0].numpy().decode("utf-8")


@pytest.mark.parametrize("kind", ["plain", "chat"])
@pytest.mark.parametrize("knobs", [dict(temperature=0.0, top_k=0, top_p=1.0, seed=0),
                                   dict(temperature=1.0, top_k=20, top_p=0.95, seed=7)],
                         ids=["greedy", "sampled"])
@pytest.mark.slow
def test_a_first_reply_equals_the_generate_signature(kind, knobs, subject):
    session = _session(subject, kind, max_new_tokens=12, **knobs)
    for prompt in PROMPTS:
        if kind == "chat" and not prompt:
            continue
        session.reset()
        out = io.StringIO()
        reply = session.reply(prompt, out)
        assert out.getvalue() == reply
        assert reply == _generate(subject.modules[kind], prompt, 12, **knobs), prompt


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_streamed_pieces_join_to_the_decode_of_the_ids(subject):
    from serving.chat import StreamDecoder

    session = _session(subject, "plain", max_new_tokens=40, temperature=1.5, top_k=0, top_p=1.0)
    for seed in range(3):  # a random model: byte tokens, characters cut between them
        session.sampling = dataclasses.replace(session.sampling, seed=seed)
        session.reset()
        ids = list(session.stream_ids(session.prompt_ids("你好世界")))
        decoder = StreamDecoder(session.surfaces)
        pieces = [decoder.push(i) for i in ids] + [decoder.finish()]
        whole = subject.modules["plain"].detokenize(input_ids=tf.constant([ids or [0]]))
        assert "".join(pieces) == whole["text"][0].numpy().decode("utf-8")


def test_chinese_cut_between_byte_tokens_is_printed_whole(subject, chinese_poems):
    from serving.chat import StreamDecoder

    session = _session(subject, "plain")
    text = chinese_poems[0]
    ids = session.prompt_ids(text)[1:]  # without the [EOS] document prefix
    assert len(ids) > len(text)  # characters are split into several byte tokens
    decoder = StreamDecoder(session.surfaces)
    pieces = [decoder.push(i) for i in ids]
    assert "" in pieces  # some tokens end inside a character: nothing printed yet
    assert "".join(pieces) + decoder.finish() == text
    cut = StreamDecoder(session.surfaces)
    partial = "".join(cut.push(i) for i in session.prompt_ids("明")[1:-1]) + cut.finish()
    assert partial == "明".encode()[:2].decode("utf-8", errors="replace") == "\ufffd"


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_reset_clears_the_history_and_restarts_the_seed_stream(subject):
    fresh = _session(subject, "plain", temperature=1.0, seed=3).reply("the", io.StringIO())
    assert fresh == _generate(subject.modules["plain"], "the", NEW, 1.0, 20, 0.9, 3)
    session = _session(subject, "plain", temperature=1.0, seed=3)
    out, err = io.StringIO(), io.StringIO()
    assert session.run(io.StringIO("the\nquick\n/reset\nthe\n/exit\n"), out, err) == 0
    assert out.getvalue().startswith(fresh + "\n") and out.getvalue().endswith("\n" + fresh + "\n")
    assert session.turns == [("the", fresh)]  # after /reset: as from the start
    assert "[history cleared]" in err.getvalue()


def test_plain_history_is_the_running_text(subject):
    session = _session(subject, "plain", temperature=0.0)
    first = session.reply("ROMEO:", io.StringIO())
    text = session._text(session.turns, "\nthe")
    assert text == "ROMEO:" + first + "\nthe"
    second = session.reply("the", io.StringIO())
    assert session.turns[-1] == ("the" if first.endswith("\n") else "\nthe", second)


def test_the_oldest_turns_are_dropped_to_fit_the_context(subject):
    session = _session(subject, "plain", max_new_tokens=30, temperature=0.0)
    err = io.StringIO()
    line = "the quick brown fox jumps over"  # 6 tokens
    for _ in range(6):
        session.reply(line, io.StringIO(), err)
    assert "dropped the" in err.getvalue() and f"context of {CONTEXT} tokens" in err.getvalue()
    assert 1 <= len(session.turns) < 6
    # What was kept starts with a whole turn and fits with the next reply's room.
    kept = session.turns[:-1]
    assert len(session.prompt_ids(session._text(kept, session.turns[-1][0]))) <= CONTEXT - 30


def test_one_turn_longer_than_the_context_is_cropped_like_generate(subject):
    session = _session(subject, "plain", max_new_tokens=20, temperature=0.0, top_k=0,
                       top_p=1.0)
    long = "the quick brown fox jumps over " * 12
    err = io.StringIO()
    reply = session.reply(long, io.StringIO(), err)
    assert f"[prompt cropped to its last {CONTEXT - 20} tokens]" in err.getvalue()
    assert reply == _generate(subject.modules["plain"], long, 20, 0.0, 0, 1.0, 0)


def test_exit_and_end_of_input_leave_with_0(subject):
    session = _session(subject, "plain")
    out = io.StringIO()
    assert session.run(io.StringIO("the\n/exit\nquick\n"), out) == 0
    assert out.getvalue().count("\n") == 1 and len(session.turns) == 1  # nothing after /exit
    assert session.run(io.StringIO(""), io.StringIO()) == 0
    assert session.run(io.StringIO("the"), io.StringIO()) == 0  # a last line without "\n"


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_chat_model_wraps_the_turns_in_its_template(subject):
    from tokenization import chat_template

    session = _session(subject, "chat", temperature=0.0)
    assert session.template == chat_template.DEFAULT_CHAT_TEMPLATE
    prefix, suffix = session.chat_prompt
    assert prefix.startswith("<｜begin▁of▁sentence｜>") and suffix.endswith("Assistant: ")
    out = io.StringIO()
    assert session.run(io.StringIO("你好\n\nthe fox\n"), out) == 0  # the empty line is skipped
    (u1, r1), (u2, r2) = session.turns
    assert (u1, u2) == ("你好", "the fox")
    assert out.getvalue() == r1 + "\n" + r2 + "\n"
    messages = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": r1},
                {"role": "user", "content": "again"}]
    text = session._text(session.turns[:1], "again")
    assert text == chat_template.render_prompt(session.template, messages, session.bos_token,
                                               session.eos_token)
    assert text.startswith(prefix + "你好" + suffix + r1 + "<｜end▁of▁sentence｜>User: again")
    assert session.turns[0][1] == _generate(subject.modules["chat"], "你好", NEW,
                                            0.0, 50, 1.0, 0)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_v4_session_starts_again_where_it_cannot_rewind_and_prefills_in_chunks(
        subject, monkeypatch):
    """DeepSeek-V4's cache is bounded (rings of the last positions): a prompt that leaves
    the cached ids before their end runs again from the start, and a prompt longer than
    the prefill chunk (8 here) runs through the cache in chunks. Each reply equals greedy
    `generate` on the same prompt ids; the session's context is the model's whole
    max_position_embeddings (no 32,768 cap)."""
    import keras
    import numpy as np

    from models.deepseek import generation
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
    from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
    from serving import chat

    keras.utils.set_random_seed(3)
    config = DeepSeekV4Config(
        vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
        n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA),
        compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe"),
        hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
        index_head_dim=8, index_topk=3, max_position_embeddings=40_000,
        num_nextn_predict_layers=0, initializer_range=0.5)
    model = DeepSeekV4CausalLM(config)
    monkeypatch.setattr(chat, "PREFILL_CHUNK", 8)
    session = chat.ChatSession(model, subject.tokenizers["chat"],
                               chat.Sampling(NEW, temperature=0.0, top_k=0, top_p=1.0),
                               subject.affixes["chat"])
    assert session.context == 40_000 and model.bounded_cache

    def expected(prompt):
        tokens, lengths = generation.generate(model, tf.constant([prompt]), NEW,
                                              temperature=0.0, stop_token_id=session.eos_id)
        return tokens.numpy()[0, len(prompt):int(lengths[0])].tolist()

    first = session.prompt_ids(session._text([], PROMPTS[2]))
    reply = list(session.stream_ids(first))
    assert len(first) > 8 and reply == [t for t in expected(first) if t != session.eos_id]
    # Continues the cached ids: no new start.
    follow = session._cached + reply[-1:] + first[:5]
    assert list(session.stream_ids(follow)) == [t for t in expected(follow)
                                                 if t != session.eos_id]
    # Leaves them early (another second half): the cache starts again.
    other = first[:6] + session.prompt_ids("你好世界😀 the quick brown fox")
    assert list(session.stream_ids(other)) == [t for t in expected(other)
                                                if t != session.eos_id]
    assert session._cached[:len(other)] == other
    assert np.all([v.shape[1] == 6 for v in (layer["kv"] for layer in session._cache)])


def test_max_new_tokens_must_leave_room_for_a_prompt(subject):
    from serving.chat import ChatSession

    for new in (0, CONTEXT):
        with pytest.raises(ValueError, match=rf"max_new_tokens={new} must be in \[1, 63\]"):
            ChatSession(subject.model, subject.tokenizers["plain"],
                        dataclasses.replace(subject.sampling, max_new_tokens=new))


@pytest.fixture(scope="module")
def saved(subject, tmp_path_factory):
    """Two SavedModels of the model's variables (`LogitsModule`, no text signatures):
    `logits_only` as saved, and `chat` with the chat tokenizer and the assets.extra files
    `save_text_model` writes beside a chat model (the model's defaults)."""
    from models.deepseek import hf_checkpoint
    from savedmodel.hf_generation import generation_config_to_hf
    from savedmodel.hf_interop import LogitsModule
    from savedmodel.layout import CHAT_PROMPT_ASSET, GENERATION_CONFIG_NAME

    root = tmp_path_factory.mktemp("saved")
    logits_only, chat = root / "logits_only", root / "chat"
    module = LogitsModule(subject.model)
    tf.saved_model.save(module, str(logits_only), signatures={"logits": module.logits})
    extra = logits_only / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / hf_checkpoint.CONFIG_NAME).write_text(
        json.dumps(hf_checkpoint.config_to_hf(subject.config)))
    shutil.copytree(logits_only, chat)
    tokenizer = subject.tokenizers["chat"]
    tokenizer.write(str(chat / "assets"))
    prefix, suffix = subject.affixes["chat"]
    (chat / "assets.extra" / CHAT_PROMPT_ASSET).write_text(
        json.dumps({"prefix": prefix, "suffix": suffix}))
    (chat / "assets.extra" / GENERATION_CONFIG_NAME).write_text(
        json.dumps(generation_config_to_hf(subject.generation, tokenizer)))
    return {"logits_only": str(logits_only), "chat": str(chat)}


def test_a_logits_only_model_is_refused_in_one_line(saved):
    import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["chat", "--model", saved["logits_only"]])
    assert str(e.value).startswith("error: chat: ") and "has no tokenizer" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_cli_chats_from_a_saved_model(subject, saved, monkeypatch, capsys):
    """`chat` reads the model, tokenizer, template and defaults of the directory
    (`ChatSession.from_dir`); the same from a pipe: tests/e2e/test_chat_e2e.py."""
    import cli
    from serving.chat import ChatSession

    session = ChatSession.from_dir(saved["chat"])
    assert session.sampling == subject.sampling  # the model's defaults
    assert session.chat_prompt == subject.affixes["chat"]
    assert session.template == subject.sessions["chat"].template is not None
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("你好\n/exit\n"))
    assert cli.main(["chat", "--model", saved["chat"]]) == 0
    # The model's weights and defaults, seed 0, as `generate` would.
    expected = _generate(subject.modules["chat"], "你好", NEW, **DEFAULTS, seed=0)
    out = capsys.readouterr().out
    assert out == expected + "\n"  # no banner nor ">>> " when stdin is not a terminal


class _Interrupted(io.StringIO):
    """An output whose first write is interrupted, as Ctrl-C while a reply is printed."""

    def write(self, text):
        if not getattr(self, "hit", False):
            self.hit = True
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_the_reply_not_the_session(subject):
    session = _session(subject, "plain", temperature=0.0)
    err = io.StringIO()
    out = _Interrupted()
    assert session.reply("the quick", out, err) == ""  # nothing was printed
    assert "[reply stopped]" in err.getvalue() and session._cache is None
    assert session.turns == [("the quick", "")]
    again = io.StringIO()
    assert session.run(io.StringIO("the\n/exit\n"), again, err) == 0
    assert len(session.turns) == 2


def test_an_interactive_session_shows_a_banner_and_prompts(subject):
    session = _session(subject, "plain")
    out = io.StringIO()
    assert session.run(io.StringIO("/reset\n"), out, interactive=True, banner="hello") == 0
    assert out.getvalue() == ("hello\n/reset clears the history, /exit or Ctrl-D leaves, "
                              "Ctrl-C stops a reply\n>>> >>> \n")


class _Signalled(io.StringIO):
    """An output that takes a SIGINT (`_on_sigint`, as the handler would) at its first write."""

    def __init__(self, session):
        super().__init__()
        self.session = session

    def write(self, text):
        if not self.getvalue():
            import signal

            self.session._on_sigint(signal.SIGINT, None)
        return super().write(text)


def test_sigint_during_a_reply_stops_it_at_the_next_step_with_the_cache_kept(subject):
    session = _session(subject, "plain", temperature=0.0, max_new_tokens=20)
    err = io.StringIO()
    out = _Signalled(session)
    reply = session.reply("the quick", out, err)
    assert reply == out.getvalue() and reply  # the first piece, then no more steps
    assert "[reply stopped]" in err.getvalue()
    assert session.turns == [("the quick", reply)]
    prompt = session.prompt_ids("the quick")  # the cache holds what the steps ran: the
    assert session._cache is not None  # prompt, then each token but the last one sampled
    assert session._cached == prompt + [int(i) for i in session._cached[len(prompt):]]
    assert len(session._cached) == len(prompt) + session.steps - 1
    again = session.reply(" the", io.StringIO(), err)  # the session goes on
    assert session.turns[-1] == ("\n the" if not reply.endswith("\n") else " the", again)


class _CtrlCAtPrompt(io.StringIO):
    """stdin where Ctrl-C is pressed at the prompt `times` times, then lines follow."""

    def __init__(self, text, times):
        super().__init__(text)
        self.times = times

    def readline(self, *args):
        if self.times:
            self.times -= 1
            raise KeyboardInterrupt
        return super().readline(*args)


def test_ctrl_c_at_the_prompt_drops_the_line_and_twice_leaves(subject):
    session = _session(subject, "plain")
    err = io.StringIO()
    assert session.run(_CtrlCAtPrompt("the\n", 1), io.StringIO(), err) == 0
    assert "[line dropped; Ctrl-C again, /exit or Ctrl-D leaves]" in err.getvalue()
    assert len(session.turns) == 1  # the line after it was answered
    assert session.run(_CtrlCAtPrompt("the\n", 2), io.StringIO(), err) == 130
    assert len(session.turns) == 1


def test_a_turn_the_template_refuses_is_reported_in_one_line(subject):
    session = _session(subject, "chat")
    template = session.template
    session.template = "{{ messages[-1]['content'] * 2000000000 }}"  # 2 GB (issue 24)
    try:
        err = io.StringIO()
        assert session.reply("你好", io.StringIO(), err) == ""
        note = err.getvalue()
        assert note.startswith("[not answered: the chat template would build") and "refused" in note
        assert note.count("\n") == 1 and session.turns == []
    finally:
        session.template = template


@pytest.mark.slow
def test_ctrl_c_at_any_moment_in_the_cli_keeps_the_session(saved, tmp_path):
    """`deepseek-tfx chat` at a terminal (a pty), SIGINT 0.3 s after the first line (the
    first reply traces the step: the prompt is being prepared), then 0, 0.05, 0.3 and 1 s
    after later lines: no traceback, each time back at the prompt, a last line answered,
    Ctrl-D leaves with 0. Before issue 24, SIGINT outside the reply's loop ended the
    session with a traceback."""
    import os
    import pty
    import re
    import select
    import signal
    import subprocess
    import time

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TERM="dumb", DEEPSEEK_TFX_LOG_DIR=str(tmp_path / "logs"),
               PYTHONPATH=root)
    master, slave = pty.openpty()
    errors = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "chat", "--model", saved["chat"],
                             "--max-new-tokens", "40"], stdin=slave, stdout=slave,
                            stderr=errors, cwd=root, env=env, start_new_session=True)
    os.close(slave)
    screen = bytearray()

    def at_prompt(timeout):
        """Reads until the child waits at `>>> ` with nothing more to say for 0.5 s."""
        end, quiet_since = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    return False
                screen.extend(chunk)
                quiet_since = time.monotonic()
            text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", bytes(screen))
            if text.endswith(b">>> ") and time.monotonic() - quiet_since > 0.5:
                return True
        return False

    try:
        assert at_prompt(240), screen.decode("utf-8", "replace")
        for line, delay in (("你好", 0.3), ("the quick", 0.0), ("ROMEO:", 0.05),
                            ("床前明月光", 0.3), ("the fox", 1.0)):
            os.write(master, line.encode("utf-8") + b"\n")
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGINT)
            assert at_prompt(120), (line, delay, screen.decode("utf-8", "replace"))
            assert proc.poll() is None, (line, delay)
        mark = len(screen)
        os.write(master, "疑是地上霜\n".encode())
        assert at_prompt(120)
        assert "疑是地上霜".encode() in screen[mark:]  # echoed, answered, prompt again
        os.write(master, b"\x04")  # Ctrl-D at an empty prompt
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        errors.close()
    stderr = (tmp_path / "stderr.txt").read_text("utf-8", "replace")
    logs = "".join(p.read_text("utf-8", "replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "Traceback" not in stderr + logs + screen.decode("utf-8", "replace"), stderr
    assert "[reply stopped]" in stderr  # the first SIGINT came while the reply was made
