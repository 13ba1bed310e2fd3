"""`deepseek-tfx`: the command line. It parses arguments and calls the pipeline;
the logic lives in the modules it calls.

  deepseek-tfx run       [--data PATH] [--preset NAME] [--output DIR] [--train-steps N]
                         [--set SECTION.FIELD=VALUE ...] [--no-cache] [--num-workers N]
                         [--runner local|beam] [--beam-arg=ARG ...] [--until COMPONENT]
                         [--accept-drift] [--base-model latest|PATH] [--teacher PATH]
  deepseek-tfx validate  --data PATH [--preset NAME] [--output DIR] [--set ...]
  deepseek-tfx compile-kfp --output FILE.yaml --pipeline-root URI [--image IMAGE]
                         [--data PATH] [--preset NAME] [--set ...] [--beam-arg=ARG ...]
  deepseek-tfx generate  --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
                         [--top-k K] [--top-p P] [--seed S] [--raw]
  deepseek-tfx chat      --model DIR [--max-new-tokens N] [--temperature T] [--top-k K]
                         [--top-p P] [--seed S]
  deepseek-tfx evaluate  --model DIR --data PATH [--seq-len N]
  deepseek-tfx serve     --model SERVING_DIR [--port P] [--host H] [--model-name NAME]
                         [--max-batch-size ROWS] [--batch-timeout-micros US]
                         [--max-enqueued-batches N] [--num-batch-threads N]
  deepseek-tfx mlmd      --output DIR {runs|artifacts|lineage MODEL_DIR} [--json]
  deepseek-tfx hf-import CHECKPOINT_DIR OUT_DIR [--no-tokenizer]
  deepseek-tfx hf-export MODEL_DIR OUT_DIR [--max-shard-size BYTES] [--config-form 4.x|5.x]
                         [--dtype float32|bfloat16]

run, validate, generate, evaluate, serve, hf-import and hf-export show the project's own
lines only; the libraries' logs and warnings go to a log file (`cli/console.py`):
  [-v|--verbose]  show them on the console too     [--log-dir DIR]  where the log goes
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import re
import shlex
import sys
import threading
import time
import urllib.request
from pathlib import Path

from cli import console
from cli.console import failure_message

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS_NAME = "tinyshakespeare.txt"
DEFAULT_CORPUS_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


# ----------------------------------------------------------------------------- data paths


def default_corpus() -> Path:
    """Tiny Shakespeare: `../shared/corpora/` beside the project when present,
    else `data/tinyshakespeare.txt`, fetched from its public source on first use."""
    for candidate in (
        PROJECT_ROOT.parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
        Path.cwd().parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
    ):
        if candidate.is_file():
            return candidate
    local = PROJECT_ROOT / "data" / DEFAULT_CORPUS_NAME
    if not local.is_file():
        print(f"fetching Tiny Shakespeare from {DEFAULT_CORPUS_URL} -> {local}",
              file=console.stderr())
        tmp = local.with_suffix(".part")
        try:
            urllib.request.urlretrieve(DEFAULT_CORPUS_URL, tmp)
        except OSError as e:
            raise SystemExit(
                f"error: cannot fetch the default corpus ({e}); pass --data PATH to a text file"
            ) from e
        tmp.rename(local)
    return local


def split_data_path(data: str) -> tuple[str, str]:
    """PATH -> (input_base, pattern) for ExampleGen: a file, a directory or a glob."""
    path = os.path.abspath(data)
    if os.path.isdir(path):
        return path, "*"
    if any(ch in os.path.basename(path) for ch in "*?["):
        return os.path.dirname(path), os.path.basename(path)
    if not os.path.isfile(path):
        raise SystemExit(f"error: --data {data}: no such file or directory")
    return os.path.dirname(path), os.path.basename(path)


def parse_overrides(items: list[str]) -> dict:
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --set {item!r}: expected SECTION.FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        overrides[key.strip()] = value
    return overrides


def component_order() -> tuple[str, ...]:
    """`pipeline.pipeline.COMPONENT_ORDER`, read from the module's source when it is a
    literal (importing the module imports TFX, ~40 s, too slow for `--help`)."""
    source = (PROJECT_ROOT / "pipeline" / "pipeline.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "COMPONENT_ORDER"):
            try:
                return tuple(ast.literal_eval(node.value))
            except ValueError:
                break
    from pipeline.pipeline import COMPONENT_ORDER

    return tuple(COMPONENT_ORDER)


# ----------------------------------------------------------------------------- progress


class ComponentProgress(logging.Handler):
    """Prints one line when a component starts and one when it is done, cached or
    failed, with its elapsed time and the time since the run began.

    It reads the orchestrators' own log messages (TFX logs through absl):
    LocalDagRunner's "Component X is running/finished", BeamDagRunner's "node X is
    running/finished", and the launcher's "A cached execution N is used", which
    comes from the thread that runs that component.
    """

    _START = re.compile(r"^(?:Component|node) (\S+) is running\.$")
    _END = re.compile(r"^(?:Component|node) (\S+) is finished\.$")
    _CACHED = re.compile(r"^A cached execution \d+ is used\.$")

    def __init__(self, stream=None):
        super().__init__(level=logging.INFO)
        self.stream = stream
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, int]] = {}  # component -> (start, thread id)
        self._cached: set[str] = set()
        self.finished: dict[str, str] = {}  # component -> "done" | "cached"

    def _print(self, component: str, what: str, seconds: float | None = None) -> None:
        took = f" ({seconds:.1f} s)" if seconds is not None else ""
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {component:<34} {what}{took}",
              file=self.stream or sys.stdout, flush=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 (a log call with bad arguments is not ours to fail)
            return
        with self._lock:
            if m := self._START.match(message):
                self._running[m.group(1)] = (time.perf_counter(), threading.get_ident())
                self._print(m.group(1), "running")
            elif self._CACHED.match(message):
                for component, (_, thread) in self._running.items():
                    if thread == threading.get_ident():
                        self._cached.add(component)
            elif m := self._END.match(message):
                component = m.group(1)
                start, _ = self._running.pop(component, (time.perf_counter(), 0))
                status = "cached" if component in self._cached else "done"
                self.finished[component] = status
                self._print(component, status, time.perf_counter() - start)

    def report_failure(self) -> None:
        """Marks the components still running as failed (call when the run raised)."""
        with self._lock:
            for component, (start, _) in self._running.items():
                self._print(component, "FAILED", time.perf_counter() - start)
            self._running.clear()


@contextlib.contextmanager
def show_progress(stream=None):
    """Shows `ComponentProgress` while the block runs; absl (TFX) warnings and errors
    are still logged as before. Yields the handler."""
    from absl import logging as absl_logging

    absl_logger = logging.getLogger("absl")
    saved = (absl_logger.level, absl_logger.propagate)
    saved_verbosity = absl_logging.get_verbosity()
    progress = ComponentProgress(stream)
    # Through absl's verbosity, not only the logger's level: TensorFlow code does
    # `v = get_verbosity(); set_verbosity(FATAL); ...; set_verbosity(v)`, which
    # resets the logger's level from absl's verbosity.
    absl_logging.set_verbosity(absl_logging.INFO)
    if saved[0] > logging.INFO:
        # TFX's INFO chatter feeds the progress lines only; WARNING and above go
        # wherever absl's records went before.
        absl_logger.propagate = False
        warnings = _ForwardHandler(logging.getLogger(), max(saved[0], logging.WARNING))
        absl_logger.addHandler(warnings)
    else:
        warnings = None
    absl_logger.addHandler(progress)
    try:
        yield progress
    except BaseException:
        progress.report_failure()
        raise
    finally:
        absl_logger.removeHandler(progress)
        if warnings is not None:
            absl_logger.removeHandler(warnings)
        absl_logging.set_verbosity(saved_verbosity)
        absl_logger.setLevel(saved[0])
        absl_logger.propagate = saved[1]


class _ForwardHandler(logging.Handler):
    """Hands records at or above `level` to another logger's handlers."""

    def __init__(self, target: logging.Logger, level: int):
        super().__init__(level=level)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


# ----------------------------------------------------------------------------- commands


def config_from_args(args: argparse.Namespace, check_tokenizer: bool = True):
    """The PipelineConfig of `--preset`, `--set` and `--train-steps`; exits naming a bad one
    (and a bad `tokenizer.path`, unless `check_tokenizer` is False)."""
    from config import get_config

    overrides = parse_overrides(args.set or [])
    if getattr(args, "train_steps", None) is not None:
        overrides["train.train_steps"] = args.train_steps
    if getattr(args, "task", None) is not None:
        overrides["data.task"] = args.task
    try:
        config = get_config(args.preset, overrides)
        if check_tokenizer and config.tokenizer.path:  # checked before anything runs
            from pipeline.pipeline import check_given_tokenizer

            config, _ = check_given_tokenizer(config)
        return config
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from e


def warm_start(args: argparse.Namespace, config, output_dir: str):
    """(config, base model for create_pipeline) of `--base-model`; exits naming a problem."""
    if not args.base_model:
        return config, None
    from pipeline import warm_start as ws

    try:
        if args.base_model == ws.LATEST:
            from pipeline.local_runner import run_paths

            uri, model_id = ws.latest_blessed_model(run_paths(output_dir)["metadata_path"])
            print(f"              base model: latest blessed, {uri} (MLMD id {model_id})")
            base_dir = uri
        else:
            base_dir = os.path.abspath(args.base_model)
            print(f"              base model: {base_dir}")
        config = ws.warm_start_config(config, base_dir, parse_overrides(args.set or []))
        from pipeline.pipeline import check_given_tokenizer

        config, _ = check_given_tokenizer(config)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from e
    return config, args.base_model if args.base_model == ws.LATEST else base_dir


def default_output(args: argparse.Namespace) -> str:
    """`run`: runs/<corpus>-<preset>; `validate`: runs/validate-<corpus>."""
    input_base, pattern = split_data_path(args.data or str(default_corpus()))
    if args.command == "validate":
        return os.path.join("runs", f"validate-{Path(pattern).stem}")
    corpus = Path(pattern).stem if pattern != "*" else Path(input_base).name
    return os.path.join("runs", f"{corpus}-{args.preset}")


def cmd_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.num_workers < 1:
        raise SystemExit(f"error: --num-workers {args.num_workers}: must be >= 1")
    data = args.data or str(default_corpus())
    input_base, pattern = split_data_path(data)
    output_dir = args.output or default_output(args)
    config, base_model = warm_start(args, config, output_dir)
    teacher = None
    if args.teacher:
        from pipeline import warm_start as ws
        from savedmodel import base_model as base_model_lib

        try:
            teacher = base_model_lib.model_dir(os.path.abspath(args.teacher))
            if not args.base_model:  # a warm start already has the (same) tokenizer
                config = ws.distillation_config(config, teacher, parse_overrides(args.set or []))
            print(f"              teacher: {teacher}")
        except ValueError as e:
            raise SystemExit(f"error: --teacher: {e}") from e

    print(f"deepseek-tfx: preset {config.preset}, data {os.path.join(input_base, pattern)}")
    print(f"              outputs under {os.path.abspath(output_dir)}")
    print(f"              runner {args.runner}"
          + (f", Beam args {' '.join(args.beam_arg)}" if args.beam_arg else "")
          + (f", until {args.until}" if args.until else ""))
    start = time.perf_counter()
    if args.runner == "beam":
        from pipeline.beam_runner import run_beam as runner
    else:
        from pipeline.local_runner import run_local as runner

    from reporting import report

    with report.written_on_failure(output_dir), show_progress():
        paths = runner(config, input_base, pattern, output_dir,
                       beam_pipeline_args=args.beam_arg or None,
                       enable_cache=not args.no_cache, until=args.until,
                       num_workers=args.num_workers, accept_drift=args.accept_drift,
                       base_model=base_model, teacher_model=teacher)
    wall = time.perf_counter() - start
    code = print_summary(paths, wall)
    report.write_report_quietly(output_dir)
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    """Ingestion, validation, cleaning and the drift check only; prints the data report.

    With `--output` set to a run's directory, drift is measured against the run of
    that directory's latest blessed model (and reported; validate never stops on it).
    """
    from config import get_config

    try:
        config = get_config(args.preset, parse_overrides(args.set or []))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    input_base, pattern = split_data_path(args.data)
    output_dir = args.output or default_output(args)
    print(f"deepseek-tfx validate: data {os.path.join(input_base, pattern)}")
    from pipeline.local_runner import run_local, run_paths

    failure = None
    try:
        with show_progress():
            run_local(config, input_base, pattern, output_dir, enable_cache=False,
                      until="DriftValidator", accept_drift=True)
    except Exception as e:  # noqa: BLE001 (reported below, with the counts that exist)
        failure = e
    print_data_report(run_paths(output_dir)["metadata_path"])
    if failure is not None:
        print(f"\nthe data does not pass: {failure_message(failure)}")
        return 1
    return 0


def cmd_compile_kfp(args: argparse.Namespace) -> int:
    """Writes the KFP v2 PipelineSpec YAML (KubeflowV2DagRunner); runs nothing."""
    from pipeline.kubeflow_runner import CONTAINER_CORPUS, compile_kfp

    config = config_from_args(args)
    try:
        path = compile_kfp(config, args.output, args.pipeline_root, image=args.image,
                           data=args.data or CONTAINER_CORPUS, serving_model_dir=args.serving_dir,
                           beam_pipeline_args=args.beam_arg or None, until=args.until)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"KFP v2 pipeline spec: {path}")
    print(f"  image {args.image}, data {args.data or CONTAINER_CORPUS}, "
          f"pipeline root {args.pipeline_root}")
    return 0


def print_data_report(metadata_path: str) -> None:
    """Records read/kept/dropped by reason, repairs, and where the artifacts are."""
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(metadata_path)} if os.path.exists(
        metadata_path) else {}
    examples = runs.get("TextExampleGen")
    if examples:
        print(f"examples: {examples.outputs.get('Examples', {}).get('uri')}")
    statistics = runs.get("StatisticsGen")
    if statistics:
        print(f"statistics (TFDV): {statistics.outputs.get('ExampleStatistics', {}).get('uri')}")
    validator = runs.get("ExampleValidator")
    if validator:
        print(f"anomalies: {validator.outputs.get('ExampleAnomalies', {}).get('uri')}")
    cleaner = runs.get("TextCleaner")
    uri = cleaner.outputs.get("Examples", {}).get("uri") if cleaner else None
    report_path = os.path.join(uri, "cleaning_report.json") if uri else ""
    if report_path and os.path.isfile(report_path):
        with open(report_path) as f:
            report = json.load(f)
        print(f"cleaning report: {report_path}")
        total = report["total"]
        print(f"records: read {total['read']}, kept {total['kept']}, dropped {total['dropped']}")
        for reason, n in sorted(total["dropped_by_reason"].items(), key=lambda kv: -kv[1]):
            where = ", ".join(f"{src} record {rec}"
                              for src, rec in report["rejected_samples"].get(reason, []))
            print(f"  dropped {reason:<28} {n:>8}   e.g. {where}")
        for repair, n in sorted(total.get("repaired", {}).items(), key=lambda kv: -kv[1]):
            print(f"  repaired {repair:<27} {n:>8}")
    drift = runs.get("DriftValidator")
    anomalies = drift.outputs.get("ExampleAnomalies", {}) if drift else {}
    if anomalies:
        measured = {k[len("drift_"):]: v for k, v in anomalies.items()
                    if k.startswith("drift_") and isinstance(v, float)}
        if not anomalies.get("baseline_statistics"):
            print("drift: no blessed run to compare with (text profile recorded)")
        else:
            verdict = "DRIFT" if anomalies.get("drift_detected") else "no drift"
            print(f"drift vs the latest blessed run: {verdict} (Jensen-Shannon divergence, "
                  f"baseline {anomalies['baseline_statistics']})")
            for name, value in sorted(measured.items()):
                print(f"  {name:<36} {value:.4f}")


def print_summary(paths: dict, wall_s: float) -> int:
    from reporting.run_summary import latest_run

    runs = latest_run(paths["metadata_path"])
    print()
    print(f"{'component':<34} {'status':<10} {'seconds':>8}")
    for r in runs:
        print(f"{r.component:<34} {r.state.lower():<10} {r.duration_s:>8.1f}")
    print(f"{'total wall time':<45} {wall_s:>8.1f}")
    by_name = {r.component: r for r in runs}
    cleaner = by_name.get("TextCleaner")
    if cleaner:
        props = cleaner.outputs.get("Examples", {})
        drops = {k[len('dropped_'):]: v for k, v in props.items() if k.startswith("dropped_")}
        print(f"\nrecords: read {props.get('records_read')}, kept {props.get('records_kept')}, "
              f"dropped {props.get('records_dropped')} {drops or ''}")
    trainer = by_name.get("Trainer")
    model = trainer.outputs.get("Model", {}) if trainer else {}
    if "train_steps" in model:
        print(f"trainer: {model['train_steps']} steps (resumed from {model.get('resumed_from_step')}), "
              f"{model.get('strategy')} x {model.get('num_replicas')} replica(s), "
              f"{model.get('precision')}, XLA {'on' if model.get('jit_compile') else 'off'}, "
              f"{model.get('tokens_per_second', 0):.0f} tokens/s, "
              f"MFU {100 * model.get('mfu', 0):.1f}% (steady state "
              f"{100 * model.get('steady_mfu', 0):.1f}%) of a peak of "
              f"{model.get('peak_flops', 0) / 1e9:.1f} GFLOP/s "
              f"({model.get('peak_flops_source', 'unknown')})")
        if model.get("moe_dropped_fraction") or model.get("skipped_steps"):
            print(f"         MoE pairs dropped by the capacity: "
                  f"{100 * model.get('moe_dropped_fraction', 0):.2f}%; steps skipped (not "
                  f"finite): {model.get('skipped_steps', 0)}")
    evaluator = by_name.get("LmEvaluator")
    if evaluator:
        ev = evaluator.outputs.get("ModelEvaluation", {})
        bl = evaluator.outputs.get("ModelBlessing", {})
        print(f"eval: bits_per_byte {ev.get('bits_per_byte', float('nan')):.4f}, "
              f"perplexity {ev.get('perplexity', float('nan')):.2f}, "
              f"tokens {ev.get('eval_tokens')}, bytes {ev.get('eval_bytes')}")
        print(f"blessed: {bool(bl.get('blessed'))} ({bl.get('blessing_message', '')})")
    pusher = by_name.get("Pusher")
    pushed = pusher.outputs.get("PushedModel", {}) if pusher else {}
    if pushed.get("pushed"):
        print(f"pushed model: {pushed.get('pushed_destination')}")
    elif pusher:
        print("pushed model: none (not blessed)")
    print(f"ML Metadata: {paths['metadata_path']}")
    failed = [r.component for r in runs if r.state not in ("COMPLETE", "CACHED")]
    return 1 if failed else 0


def resolve_model_dir(model: str) -> str:
    """A SavedModel directory, or a serving directory whose newest version is used."""
    if os.path.isfile(os.path.join(model, "saved_model.pb")):
        return model
    versions = [d for d in os.listdir(model) if d.isdigit()] if os.path.isdir(model) else []
    if not versions:
        raise SystemExit(f"error: --model {model}: no SavedModel and no numbered versions in it")
    return os.path.join(model, max(versions, key=int))


def require_text_model(model_dir: str, command: str, what: str) -> None:
    """Exits with one line when the SavedModel has no tokenizer (logits only)."""
    from savedmodel.export import NoTokenizerError, has_tokenizer

    if not has_tokenizer(model_dir):
        raise SystemExit(f"error: {command}: {NoTokenizerError(model_dir, what)}")


def check_max_new_tokens(model_dir: str, max_new_tokens: int) -> None:
    """Exits with one line when `--max-new-tokens` leaves no room in the model's context:
    `generate` keeps the prompt's last max(context - max_new_tokens, 1) tokens, so
    max_new_tokens must be in [1, max_position_embeddings - 1]."""
    from savedmodel.base_model import read_model_config

    try:
        context = read_model_config(model_dir).max_position_embeddings
    except (FileNotFoundError, ValueError):  # no config beside the model: the signature checks
        return
    if not 1 <= max_new_tokens <= context - 1:
        raise SystemExit(
            f"error: --max-new-tokens {max_new_tokens}: must be in [1, {context - 1}]; "
            f"the model's context is {context} positions (max_position_embeddings) and the "
            "prompt keeps at least one")


def cmd_generate(args: argparse.Namespace) -> int:
    model_dir = resolve_model_dir(args.model)
    require_text_model(model_dir, "generate", "generate text")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    check_max_new_tokens(model_dir, args.max_new_tokens)
    loaded = tf.saved_model.load(model_dir)
    signature = "generate"
    if args.raw:
        if "generate_raw" in loaded.signatures:
            signature = "generate_raw"
        else:
            print(f"note: {model_dir} has no chat template; --raw changes nothing",
                  file=console.stderr())
    prompts = tf.constant([args.prompt])
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
    model_dir = resolve_model_dir(args.model)
    require_text_model(model_dir, "evaluate", "score text")
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
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from config import ServeConfig

    try:
        serve = ServeConfig(max_batch_size=args.max_batch_size,
                            batch_timeout_micros=args.batch_timeout_micros,
                            max_enqueued_batches=args.max_enqueued_batches,
                            num_batch_threads=args.num_batch_threads)
    except ValueError as e:
        raise SystemExit(f"error: serve: {e}") from e
    from serving.server import make_http_server

    try:
        httpd = make_http_server(args.model, host=args.host, port=args.port,
                                 model_name=args.model_name, serve=serve)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    server = httpd.model_server
    host, port = httpd.server_address[:2]
    kind = "" if server.has_tokenizer else " (no tokenizer: logits only, token ids in)"
    print(f"serving {server.path} (version {server.version}) as '{server.name}' on "
          f"http://{host}:{port}/v1/models/{server.name}  (Ctrl-C stops)", flush=True)
    print(f"  signatures: {', '.join(sorted(server.signatures))}{kind}", flush=True)
    print(f"  batching: max_batch_size {serve.max_batch_size} rows, batch_timeout_micros "
          f"{serve.batch_timeout_micros} ({serve.batch_timeout_micros / 1000:g} ms), "
          f"max_enqueued_batches {serve.max_enqueued_batches}, num_batch_threads "
          f"{serve.num_batch_threads}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        server.close()
        stats = server.stats()
        print(f"served {stats['requests']} requests in {stats['calls']} model calls "
              f"({stats['rows'] / max(stats['calls'], 1):.1f} rows per call, at most "
              f"{stats['max_rows']}; {stats['retried_batches']} failed batches run again "
              f"request by request; {stats['refused']} refused with 503)", flush=True)
    return 0


def cmd_mlmd(args: argparse.Namespace) -> int:
    from pipeline.local_runner import run_paths
    from reporting.mlmd_report import report

    if args.what == "lineage" and not args.model_dir:
        raise SystemExit("error: mlmd lineage needs MODEL_DIR (a serving dir or version dir)")
    try:
        print(report(run_paths(args.output)["metadata_path"], args.what, args.model_dir,
                     as_json=args.json))
    except (FileNotFoundError, LookupError) as e:
        raise SystemExit(f"error: {e}") from e
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from reporting.report import write_report

    try:
        print(f"report: {write_report(args.output)}")
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    return 0


def cmd_hf_import(args: argparse.Namespace) -> int:
    from savedmodel.hf_interop import hf_import

    try:
        imported = hf_import(args.checkpoint_dir, args.out_dir,
                             use_tokenizer=not args.no_tokenizer)
    except (FileNotFoundError, ValueError) as e:  # CheckpointError, UnsupportedTokenizerError
        raise SystemExit(f"error: {e}") from e
    print(f"SavedModel with signatures {', '.join(imported.signatures)}: "
          f"{os.path.abspath(imported.path)}")
    if imported.tokenizer is None:
        why = "--no-tokenizer" if args.no_tokenizer else f"no tokenizer.json in {args.checkpoint_dir}"
        print(f"  logits only ({why}): generate, evaluate and text requests to serve need a "
              "tokenizer")
    else:
        g = imported.generation
        sampling = ("greedy" if g.temperature == 0 else
                    f"temperature {g.temperature}, top_k {g.top_k}, top_p {g.top_p}")
        print(f"  tokenizer: {imported.tokenizer}")
        print(f"  serving_default: {sampling}, max_new_tokens {g.max_new_tokens} "
              f"(from {imported.generation_source})")
    return 0


def cmd_hf_export(args: argparse.Namespace) -> int:
    from savedmodel.hf_interop import hf_export

    model_dir = resolve_model_dir(args.model_dir)
    try:
        files = hf_export(model_dir, args.out_dir, max_shard_bytes=args.max_shard_size,
                          config_form=args.config_form, dtype=args.dtype)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    shards = [f for f in files if f.endswith(".safetensors")]
    names = sorted({os.path.basename(f) for f in files} - {os.path.basename(f) for f in shards})
    print(f"HF checkpoint ({len(shards)} safetensors file(s), {', '.join(['config.json'] + names)})"
          f": {os.path.abspath(args.out_dir)}")
    if "tokenizer.json" not in names:
        print(f"  no tokenizer: {model_dir} carries none (logits only)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepseek-tfx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    order = component_order()
    run = sub.add_parser("run", help="run the TFX pipeline on this machine (LocalDagRunner or "
                         "BeamDagRunner)")
    run.add_argument("--data", help="text/JSONL file, directory or glob (default: Tiny Shakespeare)")
    run.add_argument("--preset", default="cpu_small", help="tiny | cpu_small | gpu_base")
    run.add_argument("--output", help="output directory (default: runs/<corpus>-<preset>)")
    run.add_argument("--train-steps", type=int, help="override train.train_steps")
    run.add_argument("--task", choices=("pretrain", "sft"),
                     help="sets data.task: pretrain (text documents) or sft (prompt/response "
                     "or chat records from JSONL, CSV or Parquet; the loss covers responses)")
    run.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field, e.g. --set model.hidden_size=128")
    run.add_argument("--no-cache", action="store_true", help="re-run every component")
    run.add_argument("--num-workers", type=int, default=1, metavar="N",
                     help="train as N MultiWorkerMirroredStrategy workers on this machine "
                     "(loopback); same global batch and data order as one worker")
    run.add_argument("--runner", choices=("local", "beam"), default="local",
                     help="orchestrator: local (LocalDagRunner, default) or beam (BeamDagRunner)")
    run.add_argument("--beam-arg", action="append", metavar="=ARG",
                     help="a Beam pipeline arg for every Beam-based component, written "
                     "--beam-arg=ARG, repeatable, e.g. --beam-arg=--direct_running_mode="
                     "multi_processing --beam-arg=--direct_num_workers=2 "
                     "(default: --direct_num_workers=1)")
    run.add_argument("--until", choices=order, metavar="COMPONENT",
                     help=f"run only up to this component, one of: {', '.join(order)}")
    run.add_argument("--accept-drift", action="store_true",
                     help="record drift from the latest blessed run's data but go on training")
    run.add_argument("--base-model", metavar="latest|PATH",
                     help="warm start: 'latest' (the latest blessed model of this --output's "
                     "pipeline) or PATH (a pushed SavedModel version directory, or a Hugging "
                     "Face checkpoint directory: config.json, safetensors, tokenizer.json); "
                     "the run keeps its architecture and tokenizer, and is blessed only when "
                     "not worse than it")
    run.add_argument("--teacher", metavar="PATH",
                     help="distill from this model (a pushed SavedModel or Hugging Face "
                     "directory with the same tokenizer): train.distill_alpha, "
                     "train.distill_temperature")
    console.add_arguments(run, "run")
    run.set_defaults(fn=cmd_run)

    val = sub.add_parser("validate", help="ingest, validate (TFDV) and clean only; print the "
                         "data report (records, rejects by reason, repairs, anomalies)")
    val.add_argument("--data", required=True, help="text/JSONL/CSV/Parquet file, directory or glob")
    val.add_argument("--preset", default="cpu_small", help="tiny | cpu_small | gpu_base")
    val.add_argument("--output", help="output directory (default: runs/validate-<corpus>)")
    val.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field, e.g. --set data.invalid_utf8=reject")
    console.add_arguments(val, "validate")
    val.set_defaults(fn=cmd_validate)

    kfp = sub.add_parser("compile-kfp", help="compile the pipeline to a Kubeflow Pipelines v2 "
                         "PipelineSpec YAML (KubeflowV2DagRunner); needs no cluster")
    kfp.add_argument("--output", required=True, metavar="FILE.yaml", help="the YAML to write")
    kfp.add_argument("--pipeline-root", required=True, metavar="URI",
                     help="where the tasks write artifacts, writable from every pod "
                     "(e.g. gs://BUCKET/deepseek-tfx); the spec's defaultPipelineRoot")
    kfp.add_argument("--image", default="deepseek-tfx:latest",
                     help="container image of every task, built from the Dockerfile "
                     "(default deepseek-tfx:latest; push it to a registry the cluster can pull)")
    kfp.add_argument("--data", metavar="GCS_OR_PATH",
                     help="the corpus as the tasks see it: file, glob or directory ending in / "
                     "(default: Tiny Shakespeare baked into the image)")
    kfp.add_argument("--serving-dir", metavar="URI",
                     help="Pusher's destination (default <pipeline-root>/serving)")
    console.add_arguments(kfp, "compile-kfp")
    kfp.add_argument("--preset", default="cpu_small", help="tiny | cpu_small | gpu_base")
    kfp.add_argument("--train-steps", type=int, help="override train.train_steps")
    kfp.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field")
    kfp.add_argument("--beam-arg", action="append", metavar="=ARG",
                     help="a Beam pipeline arg for every Beam-based component (--beam-arg=ARG, "
                     "repeatable; default --direct_num_workers=1)")
    kfp.add_argument("--until", choices=order, metavar="COMPONENT",
                     help="compile only up to this component")
    kfp.set_defaults(fn=cmd_compile_kfp)

    gen = sub.add_parser("generate", help="generate text with a pushed model")
    gen.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true",
                     help="a chat (SFT) model: continue the prompt as given, without its chat "
                     "template (the generate_raw signature)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=50, help="0 = off")
    gen.add_argument("--top-p", type=float, default=0.95, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    console.add_arguments(gen, "generate")
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
    console.add_arguments(chat, "chat")
    chat.set_defaults(fn=cmd_chat)

    ev = sub.add_parser("evaluate", help="bits per byte and perplexity of a pushed model on text")
    ev.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    ev.add_argument("--data", required=True, help="text/JSONL file, directory or glob")
    ev.add_argument("--seq-len", type=int, metavar="N",
                    help="scoring window in tokens (default: the pipeline's train.seq_len; "
                    "min(max_position_embeddings, 1024) for a model without a pipeline config, "
                    "e.g. from hf-import)")
    console.add_arguments(ev, "evaluate")
    ev.set_defaults(fn=cmd_evaluate)

    srv = sub.add_parser("serve", help="serve the newest pushed version over HTTP on the "
                         "TensorFlow Serving REST API")
    srv.add_argument("--model", required=True, help="serving dir (its newest version is "
                     "served) or a SavedModel dir (served as version 1)")
    srv.add_argument("--port", type=int, default=8501, help="default 8501, as TF Serving's REST")
    srv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    srv.add_argument("--model-name", default="deepseek", help="the <name> of /v1/models/<name>")
    from config import ServeConfig

    batching = ServeConfig()  # TF Serving's batching parameters, same names
    for field, metavar, what in (
            ("max_batch_size", "ROWS", "most prompts (rows) in one model call, and in one request"),
            ("batch_timeout_micros", "US", "how long the oldest queued request waits for "
                                           "batch-mates, microseconds"),
            ("max_enqueued_batches", "N", "queued rows beyond N x max batch size get a 503"),
            ("num_batch_threads", "N", "batches run at the same time")):
        default = getattr(batching, field)
        srv.add_argument("--" + field.replace("_", "-"), type=int, default=default,
                         metavar=metavar, help=f"{what} (default {default})")
    console.add_arguments(srv, "serve")
    srv.set_defaults(fn=cmd_serve)

    md = sub.add_parser("mlmd", help="what ML Metadata recorded: runs, artifacts, lineage")
    md.add_argument("--output", required=True, help="a run's output directory (holds metadata.db)")
    md.add_argument("what", choices=("runs", "artifacts", "lineage"))
    md.add_argument("model_dir", nargs="?", help="lineage: the pushed model (serving dir, "
                    "version dir or Model artifact URI)")
    md.add_argument("--json", action="store_true", help="JSON for machines")
    md.set_defaults(fn=cmd_mlmd)

    rep = sub.add_parser("report", help="rebuild report.html (pipeline, data, training, MoE, "
                         "eval, samples, lineage) of the newest run in a directory")
    rep.add_argument("--output", required=True, help="a run's output directory (holds "
                     "metadata.db); report.html is written there")
    console.add_arguments(rep, "report")
    rep.set_defaults(fn=cmd_report)

    hf_in = sub.add_parser("hf-import", help="HF DeepSeek-V3 checkpoint -> SavedModel (text "
                           "signatures with tokenizer.json, else logits only)")
    hf_in.add_argument("checkpoint_dir", help="config.json + *.safetensors (sharded or not), "
                       "optionally tokenizer.json, tokenizer_config.json, generation_config.json")
    hf_in.add_argument("out_dir", help="where the SavedModel is written")
    hf_in.add_argument("--no-tokenizer", action="store_true",
                       help="import the weights only (logits), ignoring tokenizer.json")
    console.add_arguments(hf_in, "hf-import")
    hf_in.set_defaults(fn=cmd_hf_import)

    hf_out = sub.add_parser("hf-export", help="SavedModel -> HF DeepSeek-V3 checkpoint")
    hf_out.add_argument("model_dir", help="a SavedModel from hf-import or the pipeline "
                        "(a serving dir: the newest version)")
    hf_out.add_argument("out_dir", help="where config.json and *.safetensors are written (and "
                        "tokenizer.json, tokenizer_config.json, generation_config.json when "
                        "the SavedModel carries a tokenizer)")
    hf_out.add_argument("--max-shard-size", type=int, default=5 * 1024**3,
                        help="bytes per safetensors shard (default 5 GiB)")
    hf_out.add_argument("--config-form", choices=("4.x", "5.x"), default="5.x",
                        help="config.json as transformers 4.x (rope_scaling) or 5.x "
                        "(rope_parameters) writes it")
    hf_out.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    console.add_arguments(hf_out, "hf-export")
    hf_out.set_defaults(fn=cmd_hf_export)
    return parser


def log_dir(args: argparse.Namespace) -> str:
    """--log-dir; else <output>/logs for commands with --output (`default_output` when not
    given), else the per-user `console.default_log_dir()`."""
    if args.log_dir:
        return args.log_dir
    if console.QUIET_COMMANDS[args.command].logs_under_output:
        args.output = args.output or default_output(args)
        return os.path.join(args.output, "logs")
    return console.default_log_dir()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet = console.QUIET_COMMANDS.get(args.command)
    if quiet is None:  # libraries log on the console, TensorFlow's C++ INFO and WARNING muted
        logging.basicConfig(level=logging.INFO, format=console.LOG_FORMAT)
        for noisy in ("absl", "apache_beam", "tensorflow"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return args.fn(args)
    if hasattr(args, "preset") and hasattr(args, "set"):
        config_from_args(args, check_tokenizer=False)  # a bad value: one line, no log opened
    command_line = shlex.join(["deepseek-tfx"] + list(sys.argv[1:] if argv is None else argv))
    with console.session(console.log_path(args.command, log_dir(args)), verbose=args.verbose,
                         announce=quiet.announce, header=command_line):
        return args.fn(args)


def entry() -> int:
    """The `deepseek-tfx` command: `main`, with an error already shown on the console (its
    messages and the log's path; the traceback is in the log) ending in exit code 1."""
    try:
        return main()
    except Exception as e:
        if console.reported(e):
            return 1
        raise


if __name__ == "__main__":
    sys.exit(entry())
