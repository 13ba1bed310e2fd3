"""`deepseek-tfx generate`, `chat` and `evaluate`: a pushed (or imported) SavedModel
put to use in this process: one completion, a conversation, bits per byte on text."""

from __future__ import annotations

import argparse
import json
import os
import sys

from cli import console, quiet_commands
from cli.data import split_data_path
from cli.model_dir import resolve_model_dir


def require_text_model(model_dir: str, command: str, what: str) -> None:
    """Exits with one line when the SavedModel has no tokenizer (logits only)."""
    from savedmodel.layout import NoTokenizerError, has_tokenizer

    if not has_tokenizer(model_dir):
        raise SystemExit(f"error: {command}: {NoTokenizerError(model_dir, what)}")


def model_context(model_dir: str) -> int | None:
    """The model's max_position_embeddings (`read_model_config`: the pipeline config, else
    assets.extra/config.json); None when no config is beside the model (the signature then
    crops a long prompt itself)."""
    from savedmodel.base_model import read_model_config

    try:
        return read_model_config(model_dir).max_position_embeddings
    except (FileNotFoundError, ValueError):
        return None


def check_max_new_tokens(context: int | None, max_new_tokens: int) -> None:
    """Exits with one line when `--max-new-tokens` leaves no room in the model's context:
    the prompt keeps at least one position, so max_new_tokens must be in
    [1, max_position_embeddings - 1]."""
    if context is not None and not 1 <= max_new_tokens <= context - 1:
        raise SystemExit(
            f"error: --max-new-tokens {max_new_tokens}: must be in [1, {context - 1}]; "
            f"the model's context is {context} positions (max_position_embeddings) and the "
            "prompt keeps at least one")


def read_prompt_file(path: str) -> bytes:
    """The bytes of `--prompt-file`, the whole file one prompt, as they are (no newline
    stripped, no BOM removed); exits with one line naming the file when it is missing,
    not a regular file, unreadable, empty or not UTF-8 (the first bad byte's offset)."""
    from common.files import shown, special_file_kind

    name = f"--prompt-file '{shown(path)}'"
    kind = special_file_kind(path)  # os.stat only: a FIFO's open() would wait for a writer
    if kind is not None:
        raise SystemExit(f"error: {name}: is {kind}, not a regular file; refused "
                         "(nothing was read)")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SystemExit(f"error: {name}: no such file") from None
    except OSError as e:
        raise SystemExit(f"error: {name}: cannot be read ({e.strerror or e})") from None
    if not data:
        raise SystemExit(f"error: {name}: the file is empty (0 bytes); a prompt needs text")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        what = ("a character cut off at the end of the file" if e.end == len(data)
                and e.reason == "unexpected end of data" else e.reason)
        raise SystemExit(f"error: {name}: not UTF-8 (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start} of {len(data)}: {what}); save it as UTF-8") from None
    return data


def count_prompt(loaded, prompt: bytes, chat_prompt: tuple[str, str] | None) -> tuple[int, int]:
    """(the prompt's tokens, the positions it takes as the signature sees it), counted by
    the SavedModel's `tokenize` signature: a plain prompt follows one [EOS] (the document
    separator); a templated one (`chat_prompt`, the chat template's prefix and suffix) is
    tokenized whole, affixes included, as `generate` does."""
    import tensorflow as tf

    texts = [prompt]
    if chat_prompt is not None:
        prefix, suffix = (a.encode("utf-8") for a in chat_prompt)
        texts.append(prefix + prompt + suffix)
    lengths = loaded.signatures["tokenize"](text=tf.constant(texts))["lengths"].numpy()
    tokens = int(lengths[0])
    return tokens, (int(lengths[1]) if chat_prompt is not None else tokens + 1)


def check_prompt_fits(model_dir: str, context: int, tokens: int, positions: int,
                      max_new_tokens: int, templated: bool) -> None:
    """Exits with one line when the prompt's positions + max_new_tokens exceed the
    context: cached decoding holds max_position_embeddings positions, prompt and new
    tokens together (the signature would silently keep only the prompt's last tokens)."""
    if positions + max_new_tokens <= context:
        return
    extra = positions - tokens  # [EOS], or the chat template's affixes
    seen = "in the chat template" if templated else "with the [EOS] separator first"
    most = context - max_new_tokens - extra
    fix = (f"the prompt may have at most {most:,} tokens with --max-new-tokens "
           f"{max_new_tokens}: shorten it or lower --max-new-tokens" if most >= 1 else
           "lower --max-new-tokens")
    raise SystemExit(
        f"error: generate: the prompt is {tokens:,} tokens ({positions:,} positions {seen}); "
        f"with --max-new-tokens {max_new_tokens} that is {positions + max_new_tokens:,} "
        f"positions, over the {context:,}-position context "
        f"(max_position_embeddings) of the model {model_dir}; {fix}")


def cmd_generate(args: argparse.Namespace) -> int:
    """Writes the completion of `--prompt` or `--prompt-file` (the `generate` signature, or
    `generate_raw` with `--raw`) on stdout; the prompt's token count on stderr. A prompt
    that does not fit the model's context with `--max-new-tokens` is refused in one line."""
    prompt = (read_prompt_file(args.prompt_file) if args.prompt_file is not None
              else args.prompt.encode("utf-8"))
    model_dir = resolve_model_dir(args.model)
    require_text_model(model_dir, "generate", "generate text")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from savedmodel.layout import read_chat_prompt

    context = model_context(model_dir)
    check_max_new_tokens(context, args.max_new_tokens)
    loaded = tf.saved_model.load(model_dir)
    signature = "generate"
    if args.raw:
        if "generate_raw" in loaded.signatures:
            signature = "generate_raw"
        else:
            print(f"note: {model_dir} has no chat template; --raw changes nothing",
                  file=console.stderr())
    chat_prompt = read_chat_prompt(model_dir) if signature == "generate" else None
    tokens, positions = count_prompt(loaded, prompt, chat_prompt)
    if context is not None:
        check_prompt_fits(model_dir, context, tokens, positions, args.max_new_tokens,
                          chat_prompt is not None)
    source = (f"{console.shown(args.prompt_file)}, {len(prompt):,} bytes"
              if args.prompt_file is not None else f"--prompt, {len(prompt):,} bytes")
    with_what = "in the chat template" if chat_prompt is not None else "with [EOS] first"
    print(f"prompt: {tokens:,} tokens ({source})" + (
        f"; {positions:,} of the model's {context:,} positions {with_what}" if context else ""),
        file=console.stderr())
    prompts = tf.constant([prompt])
    n = tf.shape(prompts)[0]  # the signature takes one value of each knob per prompt
    out = loaded.signatures[signature](
        prompt=prompts,
        max_new_tokens=tf.fill([n], tf.constant(args.max_new_tokens, tf.int32)),
        temperature=tf.fill([n], tf.constant(args.temperature, tf.float32)),
        top_k=tf.fill([n], tf.constant(args.top_k, tf.int32)),
        top_p=tf.fill([n], tf.constant(args.top_p, tf.float32)),
        seed=tf.fill([n], tf.constant(args.seed, tf.int32)),
    )
    sys.stdout.write(out["text"][0].numpy().decode("utf-8") + "\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """A conversation on stdin/stdout, replies streamed (`serving/chat.py`)."""
    model_dir = resolve_model_dir(args.model)
    require_text_model(model_dir, "chat", "chat")
    from serving.chat import ChatSession

    try:
        session = ChatSession.from_dir(model_dir, max_new_tokens=args.max_new_tokens,
                                       temperature=args.temperature, top_k=args.top_k,
                                       top_p=args.top_p, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"error: chat: {e}") from e
    for stream in (sys.stdin, sys.stdout):  # any language, whatever the locale
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors="replace")
    kind = "chat template" if session.chat_prompt else "plain LM: lines continue the text"
    return session.run(sys.stdin, sys.stdout, console.stderr(), interactive=sys.stdin.isatty(),
                       banner=f"{model_dir} ({kind}; {session.context} tokens of context)")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Prints the metrics of `serving/evaluate.py` (bits per byte, perplexity) on `--data`
    and each `--tasks` file's scores (`evaluation/task_models.py`, as the LmEvaluator
    scores them) as one JSON object on stdout; a line per task with its chance level on
    stderr; `--samples PATH` writes each example's scores."""
    if not args.data and not args.tasks:
        raise SystemExit("error: evaluate: give --data PATH, --tasks FILE ..., or both")
    model_dir = resolve_model_dir(args.model)
    require_text_model(model_dir, "evaluate", "score text")
    from evaluation.tasks import TaskFileError, load_tasks

    try:
        tasks = load_tasks(args.tasks or [])
    except TaskFileError as e:
        raise SystemExit(f"error: evaluate: {e}") from e
    if args.batch_size < 1:
        raise SystemExit(f"error: evaluate: --batch-size {args.batch_size}: must be >= 1")
    metrics: dict = {}
    if args.data:
        from serving.evaluate import evaluate_text_files

        input_base, pattern = split_data_path(args.data)
        try:
            metrics = evaluate_text_files(model_dir, os.path.join(input_base, pattern),
                                          seq_len=args.seq_len)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: evaluate: {e}") from e
        if metrics["config"] == "defaults":
            print(f"note: {model_dir} has no pipeline config (assets.extra/deepseek_tfx_config.json): "
                  f"documents read with the default data config, windows of {metrics['seq_len']} "
                  "tokens (--seq-len changes it)", file=console.stderr())
    if tasks:
        from evaluation.task_models import from_saved_model, score_tasks
        from evaluation.tasks import PRIMARY_METRIC

        try:
            scored = score_tasks(from_saved_model(model_dir), tasks, args.batch_size)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: evaluate: {e}") from e
        metrics["tasks"] = scored["tasks"]
        for name, m in scored["tasks"].items():
            shown = [k for k in ("acc", "acc_norm", "exact_match") if k in m]
            print(f"{name}: " + ", ".join(f"{k} {m[k]:.4f} ± {m[k + '_stderr']:.4f}" for k in shown)
                  + f" (chance {m['chance']:.4f}; n {m['n']}, primary {PRIMARY_METRIC[m['type']]})",
                  file=console.stderr())
        if args.samples:
            with open(args.samples, "w", encoding="utf-8") as f:
                json.dump(scored["samples"], f, ensure_ascii=False)
    print(json.dumps(metrics, indent=2, ensure_ascii=False))
    return 0


def add_parsers(sub) -> None:
    """Registers `generate`, `chat` and `evaluate` on `sub`, the top-level parser's
    `add_subparsers()`."""
    gen = sub.add_parser("generate", help="generate text with a pushed model")
    gen.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--prompt-file", metavar="PATH",
                        help="a UTF-8 file whose whole content (bytes as they are) is the prompt")
    gen.add_argument("--raw", action="store_true",
                     help="a chat (SFT) model: continue the prompt as given, without its chat "
                     "template (the generate_raw signature)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=50, help="0 = off")
    gen.add_argument("--top-p", type=float, default=0.95, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    quiet_commands.add_arguments(gen, "generate")
    gen.set_defaults(fn=cmd_generate)

    chat = sub.add_parser("chat", help="talk to a pushed or imported model, replies streamed "
                          "(/reset clears the history, /exit or Ctrl-D leaves)")
    chat.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    chat.add_argument("--max-new-tokens", type=int,
                      help="per reply (default: the model's generation_config.json, else 100)")
    chat.add_argument("--temperature", type=float,
                      help="0 = greedy (default: the model's generation config)")
    chat.add_argument("--top-k", type=int, help="0 = off (default: the model's)")
    chat.add_argument("--top-p", type=float, help="1.0 = off (default: the model's)")
    chat.add_argument("--seed", type=int, default=0,
                      help="the first reply samples step t with seed (S, t), as generate")
    quiet_commands.add_arguments(chat, "chat")
    chat.set_defaults(fn=cmd_chat)

    ev = sub.add_parser("evaluate", help="bits per byte and perplexity of a pushed model on text, "
                        "and benchmark task scores (acc, acc_norm, exact_match)")
    ev.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    ev.add_argument("--data", help="text/JSONL file, directory or glob")
    ev.add_argument("--tasks", nargs="+", metavar="FILE",
                    help="benchmark task files (JSONL, evaluation/tasks.py), scored as the "
                    "LmEvaluator and lm-evaluation-harness score them")
    ev.add_argument("--batch-size", type=int, default=16, metavar="N",
                    help="rows per forward pass when scoring tasks (default 16)")
    ev.add_argument("--samples", metavar="PATH",
                    help="write each task example's scores (choice log-likelihoods in nats, or "
                    "the completion) as JSON")
    ev.add_argument("--seq-len", type=int, metavar="N",
                    help="scoring window in tokens (default: the pipeline's train.seq_len; "
                    "min(max_position_embeddings, 1024) for a model without a pipeline config, "
                    "e.g. from hf-import)")
    quiet_commands.add_arguments(ev, "evaluate")
    ev.set_defaults(fn=cmd_evaluate)
