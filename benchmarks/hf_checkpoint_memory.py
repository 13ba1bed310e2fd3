"""Peak memory of Hugging Face checkpoints at real size: import, export and fine-tuning.

  python benchmarks/hf_checkpoint_memory.py [--ckpt-dir DIR] [--small-ckpt-dir DIR]
      [--skip-import] [--skip-finetune] [--skip-large-lora] [--runs NAMES] [--out FILE.json]
      [--work-dir DIR] [--keep]

The checkpoints are made by `benchmarks/make_hf_checkpoint.py` (transformers, offline):
a bf16 DeepSeek-V3-architecture checkpoint of 1.36 B parameters in 3 shards (`--ckpt-dir`,
default /work/bench_ckpt/v3_1p3b) and one of 162 M (`--small-ckpt-dir`, default
/work/bench_ckpt/v3_small), both with DeepSeek's tokenizer.json.

Each step runs as a child process of this project's Python under `/usr/bin/time -v`, one
at a time; before each, the script waits (up to `--wait-max-s`) until the machine has
`--min-free-gb` of MemAvailable, since the figures are meaningless under memory pressure.
Peak RSS is `/usr/bin/time`'s "Maximum resident set size": the largest single process
of the step (the CLI runs the whole step in one process: LocalDagRunner, Beam's
in-process DirectRunner, one training worker). Sizes are in GB (10**9 bytes), as
checkpoint sizes are usually quoted; "GiB" would be 7% larger numbers.

Steps:
  1. `python -m cli hf-import CKPT SM`: peak RSS, wall time, SavedModel bytes (all files
     under SM), beside the acceptance bounds of issue 23 (peak <= 1.3 x checkpoint bytes
     + 1.5 GB; SavedModel <= 1.1 x checkpoint bytes). Checkpoint bytes = its *.safetensors.
  2. `python -m cli hf-export SM OUT [--dtype bfloat16]`: peak RSS, wall time, bytes.
  3. LoRA fine-tuning of CKPT through `python -m cli run --base-model CKPT`, a few steps
     of short sequences on a slice of Tiny Shakespeare (`--until Trainer`: the pipeline
     up to and including the Trainer, which loads the base model, trains and exports).
  4. Full and LoRA fine-tuning of the small checkpoint, the same way.

The column "planned" is what `python -m cli plan` predicts for the step, when that
command exists (`--plan-args`, a template, says how it is called; its JSON output's
`total` bytes, or the first "total ... GiB" of its text, is taken); else "n/a".

The script prints its figures and writes them to `--out` (JSON); it never asserts on
them (a step that fails is reported with its exit status and the last lines of its log).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 10**9
CORPUS = os.path.join(os.path.dirname(ROOT), "shared", "corpora", "tinyshakespeare.txt")

# The fine-tuning runs: few steps, short sequences, small batches (see --steps etc.).
# `--preset tiny` only sets the training knobs here: a warm start takes the model
# (architecture) and tokenizer from --base-model.
PLAN_ARGS = ("plan --config {config} --mode {mode} --weights-dtype {weights_dtype} "
             "--compute-dtype {weights_dtype} "
             "--lora-rank {lora_rank} --batch {batch} --seq-len {seq_len} --devices 1 --json")


def mem_available_bytes() -> int:
    """MemAvailable of /proc/meminfo, bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def wait_for_memory(min_free_gb: float, max_wait_s: float) -> float:
    """Waits until MemAvailable >= min_free_gb (polling every 10 s, at most max_wait_s);
    returns the GB available when it goes on."""
    start = time.monotonic()
    while True:
        free = mem_available_bytes() / GB
        if free >= min_free_gb:
            return free
        if time.monotonic() - start > max_wait_s:
            print(f"  (only {free:.1f} GB available after waiting {max_wait_s:.0f} s; "
                  f"going on: the figures may suffer)", flush=True)
            return free
        print(f"  waiting: {free:.1f} GB available, {min_free_gb} GB wanted", flush=True)
        time.sleep(10)


def tree_bytes(path: str) -> int:
    """Apparent size of every regular file under `path` (du -sb), bytes."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.isfile(p) and not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def safetensors_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors"))


def parse_time_v(text: str) -> dict:
    """Peak RSS (bytes), wall seconds and exit status (-N: killed by signal N) from
    `/usr/bin/time -v`'s report."""
    out = {}
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if m:
        out["peak_rss_bytes"] = int(m.group(1)) * 1024
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if m:
        seconds = 0.0
        for part in m.group(1).split(":"):
            seconds = seconds * 60 + float(part)
        out["wall_s"] = seconds
    m = re.search(r"Exit status: (\d+)", text)
    if m:
        out["exit_status"] = int(m.group(1))
    m = re.search(r"Command terminated by signal (\d+)", text)
    if m:  # /usr/bin/time then says "Exit status: 0"
        out["exit_status"] = -int(m.group(1))
    return out


def run_step(name: str, cli_args: list[str], log_dir: str, args,
             rss_limit_gb: float | None = None) -> dict:
    """Runs `python -m cli *cli_args` under /usr/bin/time -v; its log goes to log_dir.

    With `rss_limit_gb`, a watchdog samples the step's resident set size (its
    processes summed, psutil, every 0.5 s) and kills the step once it exceeds the
    limit; the result then says `killed_over_limit` and the peak is at least the limit.
    """
    free = wait_for_memory(args.min_free_gb, args.wait_max_s)
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "cli", *cli_args]
    print(f"\n[{name}] {free:.1f} GB available; {shlex.join(cmd[2:])}", flush=True)
    log_path = os.path.join(log_dir, f"{name}.log")
    killed = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        if rss_limit_gb:
            killed = watch_rss(proc.pid, rss_limit_gb * GB)
        proc.wait()
    with open(log_path, errors="replace") as f:
        text = f.read()
    result = {"step": name, "command": shlex.join(cmd[2:]), "log": log_path,
              "mem_available_before_bytes": int(free * GB), **parse_time_v(text)}
    result.setdefault("exit_status", proc.returncode)
    if killed:
        result.update(killed_over_limit=True, rss_limit_bytes=int(rss_limit_gb * GB))
        print(f"  killed: its RSS went over {rss_limit_gb} GB after "
              f"{result.get('wall_s', float('nan')):.0f} s", flush=True)
    elif result["exit_status"] != 0:
        tail = [line for line in text.splitlines()
                if line.strip() and not line.startswith("\t")][-5:]
        result["error_tail"] = tail
        print(f"  exit {result['exit_status']}: " + " | ".join(tail), flush=True)
    else:
        print(f"  peak RSS {fmt_gb(result.get('peak_rss_bytes'))}, wall "
              f"{result.get('wall_s', float('nan')):.0f} s", flush=True)
    return result


def watch_rss(time_pid: int, limit_bytes: float) -> bool:
    """Until the process `time_pid` (/usr/bin/time) ends: every 0.5 s, sums the RSS of
    its descendants; over `limit_bytes`, kills them (by pid, deepest first) and
    returns True."""
    import psutil

    try:
        parent = psutil.Process(time_pid)
    except psutil.NoSuchProcess:
        return False
    while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
        try:
            children = parent.children(recursive=True)
            rss = sum(c.memory_info().rss for c in children)
        except psutil.NoSuchProcess:
            rss = 0
            children = []
        if rss > limit_bytes:
            for c in reversed(children):
                try:
                    c.kill()
                except psutil.NoSuchProcess:
                    pass
            return True
        time.sleep(0.5)
    return False


def plan_command_exists() -> bool:
    proc = subprocess.run([sys.executable, "-m", "cli", "plan", "--help"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return proc.returncode == 0


def planned(args, available: bool, **fields) -> dict:
    """What `python -m cli plan` predicts (bytes), or n/a with the reason."""
    if not available:
        return {"planned": None, "plan_note": "no `plan` command"}
    cmd = [sys.executable, "-m", "cli", *shlex.split(args.plan_args.format(**fields))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        return {"planned": None, "plan_note": f"exit {proc.returncode}: {last}",
                "plan_command": shlex.join(cmd[2:])}
    total = None
    try:
        doc = json.loads(proc.stdout)
        doc = doc[0] if isinstance(doc, list) and doc else doc
        for key in ("total", "total_bytes"):
            if isinstance(doc, dict) and isinstance(doc.get(key), (int, float)):
                total = int(doc[key])
                break
    except json.JSONDecodeError:
        m = re.search(r"total\D*?([\d.]+)\s*GiB", proc.stdout, re.IGNORECASE)
        if m:
            total = int(float(m.group(1)) * 2**30)
    return {"planned": total, "plan_command": shlex.join(cmd[2:]),
            **({} if total else {"plan_note": "no total in its output"})}


def fmt_gb(n) -> str:
    return "n/a" if n is None else f"{n / GB:.2f} GB"


def make_corpus(work: str, size: int) -> str:
    """The first `size` bytes of Tiny Shakespeare (cut at a line end) in work/corpus.txt."""
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read(size)
    text = text[: text.rfind("\n") + 1]
    path = os.path.join(work, "corpus", "shakespeare_slice.txt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def finetune_args(ckpt: str, output: str, data: str, lora_rank: int, args) -> list[str]:
    """`run --base-model CKPT` with a tiny step budget; lora_rank 0 = full fine-tuning."""
    steps = args.steps
    sets = {
        "train.lora_rank": lora_rank,
        "train.seq_len": args.seq_len,
        "train.batch_size": args.batch,
        "train.warmup_steps": 0,
        "train.checkpoint_every": steps,
        "train.log_every": 1,
        "train.eval_batches": 1,
        "train.shuffle_buffer": 100,
        "eval.batch_size": args.batch,
    }
    out = ["run", "--base-model", ckpt, "--preset", "tiny", "--data", data, "--output", output,
           "--no-cache", "--train-steps", str(steps)]
    if args.until:
        out += ["--until", args.until]
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt-dir", default="/work/bench_ckpt/v3_1p3b",
                        help="the >= 1.3B bf16 checkpoint (make_hf_checkpoint.py large)")
    parser.add_argument("--small-ckpt-dir", default="/work/bench_ckpt/v3_small",
                        help="the small checkpoint for full vs LoRA (make_hf_checkpoint.py small)")
    parser.add_argument("--work-dir", help="where SavedModels, exports, runs and logs go "
                        "(default: a new temporary folder, removed at the end unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep --work-dir's outputs")
    parser.add_argument("--skip-import", action="store_true", help="no hf-import/hf-export")
    parser.add_argument("--skip-finetune", action="store_true", help="no fine-tuning runs")
    parser.add_argument("--skip-large-lora", action="store_true",
                        help="no LoRA run on --ckpt-dir (only the small checkpoint's runs)")
    parser.add_argument("--runs", default="lora-large,full-small,lora-small",
                        help="which fine-tuning runs (comma-separated)")
    parser.add_argument("--export-dtype", default="bfloat16",
                        help="hf-export --dtype (empty: leave the option out)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per fine-tune")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--until", default="Trainer",
                        help="run --until (empty: the whole pipeline, evaluator and pusher too)")
    parser.add_argument("--corpus-bytes", type=int, default=200_000,
                        help="bytes of Tiny Shakespeare to fine-tune on")
    parser.add_argument("--large-lora-limit-gb", type=float, default=14.0,
                        help="kill the LoRA run on --ckpt-dir when its RSS exceeds this "
                        "(0: no limit); the machine is shared")
    parser.add_argument("--min-free-gb", type=float, default=12.0,
                        help="wait before each step until this much memory is available")
    parser.add_argument("--wait-max-s", type=float, default=1800.0)
    parser.add_argument("--plan-args", default=PLAN_ARGS,
                        help="how `python -m cli plan` is called (a template with {config}, "
                        "{mode}, {weights_dtype}, {lora_rank}, {batch}, {seq_len})")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)

    for d in (args.ckpt_dir, args.small_ckpt_dir):
        if not os.path.isfile(os.path.join(d, "config.json")):
            raise SystemExit(f"error: {d}: no config.json (make it with "
                             f"benchmarks/make_hf_checkpoint.py)")
    work = args.work_dir or tempfile.mkdtemp(prefix="hf_ckpt_memory_")
    os.makedirs(work, exist_ok=True)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    has_plan = plan_command_exists()
    ckpt_bytes = safetensors_bytes(args.ckpt_dir)
    small_bytes = safetensors_bytes(args.small_ckpt_dir)
    info = {}
    for key, d in (("checkpoint", args.ckpt_dir), ("small_checkpoint", args.small_ckpt_dir)):
        meta_path = os.path.join(d, "checkpoint.json")
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        info[key] = {"path": d, "safetensors_bytes": safetensors_bytes(d),
                     "parameters": meta.get("parameters", {}).get("total")}
    print(f"checkpoint {args.ckpt_dir}: {ckpt_bytes:,} bytes of safetensors "
          f"({info['checkpoint']['parameters'] or '?'} parameters)")
    print(f"small checkpoint {args.small_ckpt_dir}: {small_bytes:,} bytes "
          f"({info['small_checkpoint']['parameters'] or '?'} parameters)")
    print(f"work dir {work}; `plan` command: {'yes' if has_plan else 'not there (n/a)'}")

    results = []
    bounds = {"import_peak_bound_bytes": int(1.3 * ckpt_bytes + 1.5 * GB),
              "savedmodel_bound_bytes": int(1.1 * ckpt_bytes)}
    common = dict(batch=args.batch, seq_len=args.seq_len, lora_rank=args.lora_rank)
    if not args.skip_import:
        sm = os.path.join(work, "savedmodel")
        shutil.rmtree(sm, ignore_errors=True)
        r = run_step("hf-import", ["hf-import", args.ckpt_dir, sm], logs, args)
        r["savedmodel_bytes"] = tree_bytes(sm) if os.path.isdir(sm) else None
        r["variables_bytes"] = (tree_bytes(os.path.join(sm, "variables"))
                                if os.path.isdir(sm) else None)
        r.update(bounds)
        r.update(planned(args, has_plan, config=os.path.join(args.ckpt_dir, "config.json"),
                         mode="inference", weights_dtype="bfloat16", **common))
        results.append(r)
        if r["exit_status"] == 0:
            exported = os.path.join(work, "exported")
            shutil.rmtree(exported, ignore_errors=True)
            cmd = ["hf-export", sm, exported]
            if args.export_dtype:
                cmd += ["--dtype", args.export_dtype]
            r = run_step("hf-export", cmd, logs, args)
            r["exported_bytes"] = (safetensors_bytes(exported) if os.path.isdir(exported)
                                   else None)
            r.update(planned(args, has_plan, config=os.path.join(args.ckpt_dir, "config.json"),
                             mode="inference", weights_dtype="bfloat16", **common))
            results.append(r)
        # The same weights as a logits-only SavedModel: no traced generate/logits text
        # graphs to serialize, so what is left is the weights' path alone.
        logits_sm = os.path.join(work, "savedmodel_logits")
        shutil.rmtree(logits_sm, ignore_errors=True)
        r = run_step("import-lgt", ["hf-import", "--no-tokenizer", args.ckpt_dir, logits_sm],
                     logs, args)
        r["savedmodel_bytes"] = tree_bytes(logits_sm) if os.path.isdir(logits_sm) else None
        r.update(bounds)
        r.update(planned(args, has_plan, config=os.path.join(args.ckpt_dir, "config.json"),
                         mode="inference", weights_dtype="bfloat16", **common))
        results.append(r)
        if not args.keep:
            shutil.rmtree(os.path.join(work, "exported"), ignore_errors=True)
            shutil.rmtree(sm, ignore_errors=True)
            shutil.rmtree(logits_sm, ignore_errors=True)

    if not args.skip_finetune:
        data = make_corpus(work, args.corpus_bytes)
        runs = [("lora-large", args.ckpt_dir, args.lora_rank),
                ("full-small", args.small_ckpt_dir, 0),
                ("lora-small", args.small_ckpt_dir, args.lora_rank)]
        wanted = {n.strip() for n in args.runs.split(",")}
        if args.skip_large_lora:
            wanted.discard("lora-large")
        for name, ckpt, rank in runs:
            if name not in wanted:
                continue
            output = os.path.join(work, "runs", name)
            shutil.rmtree(output, ignore_errors=True)
            limit = args.large_lora_limit_gb if name == "lora-large" else None
            r = run_step(name, finetune_args(ckpt, output, data, rank, args), logs, args,
                         rss_limit_gb=limit or None)
            r.update(planned(args, has_plan, config=os.path.join(ckpt, "config.json"),
                             mode="lora" if rank else "full",
                             weights_dtype="bfloat16" if rank else "float32",
                             **dict(common, lora_rank=rank or args.lora_rank)))
            results.append(r)
            if not args.keep:
                shutil.rmtree(output, ignore_errors=True)
        if "lora-large" not in wanted:
            results.append({"step": "lora-large", "skipped": True,
                            "reason": "--skip-large-lora" if args.skip_large_lora else "--runs"})

    print_table(ckpt_bytes, small_bytes, results)
    doc = {"checkpoints": info, "settings": {k: v for k, v in vars(args).items()},
           "plan_command": has_plan, "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"\nwritten: {args.out}")
    if not args.work_dir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(ckpt_bytes: int, small_bytes: int, results: list[dict]) -> None:
    print(f"\ncheckpoint: {fmt_gb(ckpt_bytes)} of safetensors; small: {fmt_gb(small_bytes)}")
    print(f"{'step':<11} {'exit':>4} {'peak RSS':>10} {'bound':>10} {'planned':>10} "
          f"{'wall':>7}  output")
    for r in results:
        if r.get("skipped"):
            print(f"{r['step']:<11} {'-':>4} {'skipped':>10}  {r.get('reason', '')}")
            continue
        bound = r.get("import_peak_bound_bytes")
        output = ""
        if r.get("killed_over_limit"):
            output = f"killed when its RSS exceeded {fmt_gb(r['rss_limit_bytes'])}"
        elif r["step"] == "hf-import":
            output = (f"SavedModel {fmt_gb(r.get('savedmodel_bytes'))} "
                      f"(bound {fmt_gb(r.get('savedmodel_bound_bytes'))}; "
                      f"variables {fmt_gb(r.get('variables_bytes'))})")
        elif r["step"] == "import-lgt":
            output = (f"logits-only SavedModel {fmt_gb(r.get('savedmodel_bytes'))} "
                      "(--no-tokenizer)")
        elif r["step"] == "hf-export":
            output = f"safetensors {fmt_gb(r.get('exported_bytes'))}"
        wall = r.get("wall_s")
        print(f"{r['step']:<11} {r.get('exit_status', '?'):>4} "
              f"{fmt_gb(r.get('peak_rss_bytes')):>10} {fmt_gb(bound) if bound else '':>10} "
              f"{fmt_gb(r.get('planned')):>10} "
              f"{(f'{wall:.0f} s' if wall is not None else 'n/a'):>7}  {output}")


if __name__ == "__main__":
    sys.exit(main())
