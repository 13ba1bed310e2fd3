"""`deepseek-tfx chat` (`serving/chat.py`): replies streamed token by token over the latent
KV cache equal the `generate` signature's, text is whole UTF-8 in any language, and the
history keeps within the context. Subjects: two tiny SavedModels (one block, no MTP, 64
positions) with a learned tokenizer that splits most Chinese characters into byte tokens,
a plain language model and a chat model (DeepSeek's template in its tokenizer_config.json)."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys

import pytest
import tensorflow as tf

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "ROMEO": 6, ":": 9, "\n": 30, "你好": 6, "世界": 5, "。": 10, ",": 20, "😀": 4}
CONTEXT, NEW = 64, 8  # max_position_embeddings; the models' default max_new_tokens
PROMPTS = ["ROMEO:", "the quick brown fox", "床前明月光，疑是地上霜。", "你好世界😀", ""]
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _save(out, chat: bool):
    import keras

    from components.transform import chat_template
    from components.transform.byte_level_bpe import ByteLevelBpe
    from components.transform.tokenizer import learn
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from pipeline.configs import GenerationConfig, get_config
    from serving.export import save_text_model

    keras.utils.set_random_seed(5)
    config = dataclasses.replace(get_config("tiny").model, vocab_size=512,
                                 max_position_embeddings=CONTEXT, num_hidden_layers=1,
                                 num_nextn_predict_layers=0)
    template = chat_template.DEFAULT_CHAT_TEMPLATE
    tokenizer = ByteLevelBpe(learn(UNITS, 300).json,
                             tokenizer_config={"chat_template": template} if chat else None)
    affixes = (chat_template.prompt_affixes(template, *chat_template.special_tokens(tokenizer))
               if chat else None)
    generation = GenerationConfig(max_new_tokens=NEW, temperature=0.9, top_k=20, top_p=0.9)
    save_text_model(DeepSeekCausalLM(config), tokenizer, generation, str(out), affixes)
    return str(out)


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("plain") / "1", chat=False)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("chat") / "1", chat=True)


@pytest.fixture(scope="module")
def signatures(plain_dir, chat_dir):
    import tensorflow_text  # noqa: F401

    return {"plain": tf.saved_model.load(plain_dir).signatures,
            "chat": tf.saved_model.load(chat_dir).signatures}


def _session(model_dir, **knobs):
    from serving.chat import ChatSession

    return ChatSession.from_dir(model_dir, **knobs)


def _generate(signature, prompt, max_new_tokens, temperature, top_k, top_p, seed):
    out = signature(prompt=tf.constant([prompt]),
                    max_new_tokens=tf.constant([max_new_tokens]),
                    temperature=tf.constant([temperature], tf.float32),
                    top_k=tf.constant([top_k]), top_p=tf.constant([top_p], tf.float32),
                    seed=tf.constant([seed]))
    return out["completion"][0].numpy().decode("utf-8")


@pytest.mark.parametrize("kind", ["plain", "chat"])
@pytest.mark.parametrize("knobs", [dict(temperature=0.0, top_k=0, top_p=1.0, seed=0),
                                   dict(temperature=1.0, top_k=20, top_p=0.95, seed=7)],
                         ids=["greedy", "sampled"])
def test_a_first_reply_equals_the_generate_signature(kind, knobs, plain_dir, chat_dir,
                                                     signatures):
    session = _session(plain_dir if kind == "plain" else chat_dir, max_new_tokens=12, **knobs)
    for prompt in PROMPTS:
        if kind == "chat" and not prompt:
            continue
        session.reset()
        out = io.StringIO()
        reply = session.reply(prompt, out)
        assert out.getvalue() == reply
        assert reply == _generate(signatures[kind]["generate"], prompt, 12, **knobs), prompt


def test_streamed_pieces_join_to_the_decode_of_the_ids(plain_dir, signatures):
    from serving.chat import StreamDecoder

    session = _session(plain_dir, max_new_tokens=40, temperature=1.5, top_k=0, top_p=1.0)
    for seed in range(3):  # a random model: byte tokens, characters cut between them
        session.sampling = dataclasses.replace(session.sampling, seed=seed)
        session.reset()
        ids = list(session.stream_ids(session.prompt_ids("你好世界")))
        decoder = StreamDecoder(session.surfaces)
        pieces = [decoder.push(i) for i in ids] + [decoder.finish()]
        whole = signatures["plain"]["detokenize"](input_ids=tf.constant([ids or [0]]))
        assert "".join(pieces) == whole["text"][0].numpy().decode("utf-8")


def test_chinese_cut_between_byte_tokens_is_printed_whole(plain_dir, chinese_poems):
    from serving.chat import StreamDecoder

    session = _session(plain_dir)
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


def test_reset_clears_the_history_and_restarts_the_seed_stream(plain_dir):
    fresh = _session(plain_dir, temperature=1.0, seed=3).reply("the", io.StringIO())
    session = _session(plain_dir, temperature=1.0, seed=3)
    out, err = io.StringIO(), io.StringIO()
    assert session.run(io.StringIO("the\nquick\n/reset\nthe\n/exit\n"), out, err) == 0
    assert out.getvalue().startswith(fresh + "\n") and out.getvalue().endswith("\n" + fresh + "\n")
    assert session.turns == [("the", fresh)]  # after /reset: as from the start
    assert "[history cleared]" in err.getvalue()


def test_plain_history_is_the_running_text(plain_dir):
    session = _session(plain_dir, temperature=0.0)
    first = session.reply("ROMEO:", io.StringIO())
    text = session._text(session.turns, "\nthe")
    assert text == "ROMEO:" + first + "\nthe"
    second = session.reply("the", io.StringIO())
    assert session.turns[-1] == ("the" if first.endswith("\n") else "\nthe", second)


def test_the_oldest_turns_are_dropped_to_fit_the_context(plain_dir):
    session = _session(plain_dir, max_new_tokens=30, temperature=0.0)
    err = io.StringIO()
    line = "the quick brown fox jumps over"  # 6 tokens
    for _ in range(6):
        session.reply(line, io.StringIO(), err)
    assert "dropped the" in err.getvalue() and f"context of {CONTEXT} tokens" in err.getvalue()
    assert 1 <= len(session.turns) < 6
    # What was kept starts with a whole turn and fits with the next reply's room.
    kept = session.turns[:-1]
    assert len(session.prompt_ids(session._text(kept, session.turns[-1][0]))) <= CONTEXT - 30


def test_one_turn_longer_than_the_context_is_cropped_like_generate(plain_dir, signatures):
    session = _session(plain_dir, max_new_tokens=20, temperature=0.0, top_k=0, top_p=1.0)
    long = "the quick brown fox jumps over " * 12
    err = io.StringIO()
    reply = session.reply(long, io.StringIO(), err)
    assert f"[prompt cropped to its last {CONTEXT - 20} tokens]" in err.getvalue()
    assert reply == _generate(signatures["plain"]["generate"], long, 20, 0.0, 0, 1.0, 0)


def test_exit_and_end_of_input_leave_with_0(plain_dir):
    session = _session(plain_dir)
    out = io.StringIO()
    assert session.run(io.StringIO("the\n/exit\nquick\n"), out) == 0
    assert out.getvalue().count("\n") == 1 and len(session.turns) == 1  # nothing after /exit
    assert session.run(io.StringIO(""), io.StringIO()) == 0
    assert session.run(io.StringIO("the"), io.StringIO()) == 0  # a last line without "\n"


def test_a_chat_model_wraps_the_turns_in_its_template(chat_dir, signatures):
    from components.transform import chat_template

    session = _session(chat_dir, temperature=0.0)
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
    assert session.turns[0][1] == _generate(signatures["chat"]["generate"], "你好", NEW,
                                            0.0, 50, 1.0, 0)


def test_max_new_tokens_must_leave_room_for_a_prompt(plain_dir):
    with pytest.raises(ValueError, match=r"max_new_tokens=64 must be in \[1, 63\]"):
        _session(plain_dir, max_new_tokens=CONTEXT)
    assert _session(plain_dir).sampling.max_new_tokens == NEW  # the model's default


def test_a_logits_only_model_is_refused_in_one_line(tmp_path, capsys):
    import json

    from models.deepseek import hf_checkpoint
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from pipeline import cli
    from pipeline.configs import get_config
    from serving.hf_interop import LogitsModule

    model = DeepSeekCausalLM(dataclasses.replace(get_config("tiny").model, num_hidden_layers=1,
                                                 num_nextn_predict_layers=0))
    module = LogitsModule(model)
    tf.saved_model.save(module, str(tmp_path), signatures={"logits": module.logits})
    (tmp_path / "assets.extra").mkdir(exist_ok=True)
    (tmp_path / "assets.extra" / "config.json").write_text(
        json.dumps(hf_checkpoint.config_to_hf(model.config)))
    with pytest.raises(SystemExit) as e:
        cli.main(["chat", "--model", str(tmp_path)])
    assert str(e.value).startswith("error: chat: ") and "has no tokenizer" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_cli_chats_from_a_pipe(plain_dir, signatures):
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "chat", "--model",
                           os.path.dirname(plain_dir)], input=b"ROMEO:\n/exit\n",
                          capture_output=True, cwd=PROJECT_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # The model's defaults (generation_config.json) and seed 0, as `generate` would.
    expected = _generate(signatures["plain"]["generate"], "ROMEO:", NEW, 0.9, 20, 0.9, 0)
    assert done.stdout.decode("utf-8") == expected + "\n"
    assert ">>>" not in done.stdout.decode("utf-8")  # no prompt noise from a pipe


class _Interrupted(io.StringIO):
    """An output whose first write is interrupted, as Ctrl-C while a reply is printed."""

    def write(self, text):
        if not getattr(self, "hit", False):
            self.hit = True
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_the_reply_not_the_session(plain_dir):
    session = _session(plain_dir, temperature=0.0)
    err = io.StringIO()
    out = _Interrupted()
    assert session.reply("the quick", out, err) == ""  # nothing was printed
    assert "[reply stopped]" in err.getvalue() and session._cache is None
    assert session.turns == [("the quick", "")]
    again = io.StringIO()
    assert session.run(io.StringIO("the\n/exit\n"), again, err) == 0
    assert len(session.turns) == 2


def test_an_interactive_session_shows_a_banner_and_prompts(plain_dir):
    session = _session(plain_dir)
    out = io.StringIO()
    assert session.run(io.StringIO("/reset\n"), out, interactive=True, banner="hello") == 0
    assert out.getvalue() == ("hello\n/reset clears the history, /exit or Ctrl-D leaves, "
                              "Ctrl-C stops a reply\n>>> >>> \n")
