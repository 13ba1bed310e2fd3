"""Benchmark-task evaluation: task files (`tasks.py`), their in-graph scoring
(`task_scoring.py`) over a SavedModel's signatures (`task_models.py`), and
lm-evaluation-harness task configs for the same files (`harness_tasks.py`)."""
