"""End to end: `deepseek-tfx chat` from a pipe on the pushed model of the shared run."""

from __future__ import annotations

import os
import subprocess
import sys

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_chat_from_a_pipe_continues_the_prompt_and_exits_0(run):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from cli import resolve_model_dir

    serving = run["serving_model_dir"]
    done = subprocess.run([sys.executable, "-m", "cli", "chat", "--model", serving],
                          input=b"ROMEO:\n/exit\n", capture_output=True, cwd=PROJECT_ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # The first reply is the generate signature's completion with the model's defaults, seed 0.
    model_dir = resolve_model_dir(serving)
    defaults = tf.saved_model.load(model_dir).signatures
    from serving.chat import default_sampling

    s = default_sampling(model_dir)
    out = defaults["generate"](
        prompt=tf.constant(["ROMEO:"]), max_new_tokens=tf.constant([s.max_new_tokens]),
        temperature=tf.constant([s.temperature]), top_k=tf.constant([s.top_k]),
        top_p=tf.constant([s.top_p]), seed=tf.constant([0]))
    completion = out["completion"][0].numpy().decode("utf-8")
    assert completion  # a continuation, not an immediate [EOS]
    assert done.stdout.decode("utf-8") == completion + "\n"
