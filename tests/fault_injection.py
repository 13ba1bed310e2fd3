"""Signals sent to worker processes when their heartbeat reaches a step (kill -9, SIGTERM),
for the tests of elastic training (`components/trainer/launcher.py`)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

from components.trainer import heartbeat


def inject(log_dir, faults, sent: list[float]) -> None:
    """Sends each fault (worker, signal, after step) when that worker's heartbeat (a process
    not signalled before) reaches the step; appends the unix time of each to `sent`."""
    signalled: set[int] = set()
    for worker, signum, after in faults:
        while True:
            beat = heartbeat.read(str(log_dir / f"heartbeat-{worker}"))
            if beat and beat.step >= after and beat.pid not in signalled:
                os.kill(beat.pid, signum)
                signalled.add(beat.pid)
                sent.append(time.time())
                break
            time.sleep(0.01)


def run_cluster_job(config, num_workers: int, train_file: str, workdir, faults=(),
                    **job_fields) -> dict:
    """Trains `config` (a PipelineConfig) on `num_workers` loopback workers
    (`launcher.run_workers`); each of `faults` = (worker, signal, after step) is sent to that
    worker once its heartbeat reaches the step (`inject`). `job_fields`: further
    `TrainingJob` fields (e.g. base_model, tokenizer_dir). The result JSON, with "restarts"
    (`launcher.Restart` dicts) and "faults" (unix time of each signal)."""
    from components.trainer import job as job_lib
    from components.trainer import launcher

    job = job_lib.TrainingJob(
        pipeline_config=config.to_json(), train_files=[train_file],
        checkpoint_dir=str(workdir / "ckpt"), log_dir=str(workdir / "logs"),
        result_path=str(workdir / "result.json"),
        peak_flops_per_device=1e11, peak_flops_source="fixed for the test", **job_fields)
    sent: list[float] = []
    injector = threading.Thread(target=inject, args=(workdir / "logs", faults, sent), daemon=True)
    injector.start()
    restarts = launcher.run_workers(job, num_workers, job_dir=str(workdir / "logs"),
                                    timeout_s=900)
    injector.join(timeout=1)
    assert len(sent) == len(faults), f"only {len(sent)} of the faults {faults} were sent"
    with open(job.result_path) as f:
        return {**json.load(f), "restarts": [dataclasses.asdict(r) for r in restarts],
                "faults": sent}
