"""The e2e tier's `--until Transform` run (tests/e2e/conftest.py `until_transform`): the
first run of test_caching_e2e.py and the LocalDagRunner reference of test_runners_e2e.py
are the same run, made once. What those modules read of it is read here at once, before
test_caching_e2e.py runs again into its output directory."""

from __future__ import annotations

import glob
import os

UNTIL = "Transform"
# The components whose outputs test_runners_e2e.py compares between runners.
COMPARED = ("TextExampleGen", "TextCleaner", "Transform")


def run_args(data, output_dir) -> list[str]:
    """`deepseek-tfx run` arguments (after the program name): tiny preset, up to UNTIL."""
    return ["run", "--data", str(data), "--preset", "tiny", "--output", str(output_dir),
            "--until", UNTIL]


def component_states(output_dir) -> dict[str, str]:
    """Component -> MLMD state of the newest run (resolver nodes left out: they
    resolve, they are never cached)."""
    from pipeline.local_runner import run_paths
    from reporting.run_summary import latest_run

    return {r.component: r.state for r in latest_run(run_paths(str(output_dir))["metadata_path"])
            if "resolver" not in r.component}


def _count_records(examples_uri: str) -> dict[str, int]:
    import tensorflow as tf

    counts = {}
    for split_dir in sorted(glob.glob(os.path.join(examples_uri, "Split-*"))):
        files = sorted(glob.glob(os.path.join(split_dir, "*")))
        compression = "GZIP" if files and files[0].endswith(".gz") else ""
        counts[os.path.basename(split_dir)[len("Split-"):]] = sum(
            1 for _ in tf.data.TFRecordDataset(files, compression_type=compression))
    return counts


def compared_outputs(out) -> dict:
    """The newest run's records per split of the COMPARED components ("counts") and the
    tokenizer.json in the transform graph's assets ("tokenizer", bytes)."""
    from pipeline.local_runner import run_paths
    from reporting.run_summary import latest_run
    from tokenization import tokenizer

    runs = {r.component: r for r in latest_run(run_paths(str(out))["metadata_path"])}
    assert all(runs[c].state == "COMPLETE" for c in COMPARED), {c: r.state for c, r in runs.items()}
    assert "Trainer" not in runs
    counts = {c: _count_records(runs[c].outputs["Examples"]["uri"]) for c in COMPARED}
    graph = runs["Transform"].outputs["TransformGraph"]["uri"]
    with open(tokenizer.find_asset(graph, tokenizer.TOKENIZER_ASSET_PREFIX), "rb") as f:
        tokenizer_json = f.read()
    return {"counts": counts, "tokenizer": tokenizer_json}
