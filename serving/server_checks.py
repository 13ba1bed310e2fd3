"""The checks of a `ModelServer` call before any model work (`RequestChecks`, a base of
`ModelServer`): rows per request, sampling ranges, token ids within the vocabulary,
max_new_tokens within the context left by the prompt, and the size of a logits reply;
each failure a `BadRequest` naming the field and its allowed range (the limits:
`serving/server.py`'s module docstring).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from serving.request_limits import BadRequest

JSON_BYTES_PER_FLOAT = 20  # a float32 as JSON text: "-0.123456789012345, "
# Sampling inputs: (allowed, what the 400 says).
_SAMPLING_RANGES = {
    "temperature": (lambda v: v >= 0, "must be >= 0 (0 = greedy)"),
    "top_k": (lambda v: v >= 0, "must be >= 0 (0 = no top-k filter)"),
    "top_p": (lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 = no nucleus filter)"),
}


class RequestChecks:
    """`ModelServer`'s request validation; reads the server's `serve`, `signatures`,
    `context`, `vocab_size`, `logits_signatures`, `default_max_new_tokens` and
    `chat_prompt`."""

    def _validate(self, name: str, inputs: dict[str, np.ndarray], rows: int) -> int:
        """Raises BadRequest naming the field and its allowed range (see `serving/server.py`).
        Returns the prompt tokens it counted: the prompts' (as the model sees them) when
        it tokenized them, the size of `input_ids` when given, else 0."""
        limit = self.serve.max_batch_size
        if rows > limit:
            raise BadRequest(f"a request may have at most max_batch_size={limit} rows "
                             f"(prompts); this one has {rows}: split it (or start serve with "
                             "a larger --max-batch-size)")
        for field, (allowed, what) in _SAMPLING_RANGES.items():
            if field in inputs:
                values = inputs[field]
                bad = np.flatnonzero(~allowed(values.reshape(-1)))
                if bad.size:
                    at = f" (prompt {bad[0]})" if values.ndim and rows > 1 else ""
                    raise BadRequest(f"{field}={values.reshape(-1)[bad[0]]} {what}{at}")
        ids = inputs.get("input_ids")
        if ids is not None and self.vocab_size and ids.size:
            bad = np.argwhere((ids < 0) | (ids >= self.vocab_size))
            if bad.size:
                where = ", ".join(str(i) for i in bad[0])
                raise BadRequest(f"input_ids must be in [0, {self.vocab_size}) (vocab_size); "
                                 f"input_ids[{where}] = {ids[tuple(bad[0])]}")
        counted = int(ids.size) if ids is not None else 0
        if "prompt" in inputs and rows and self.context and "tokenize" in self.signatures:
            counted = self._check_room(name, inputs, rows)
        if name in self.logits_signatures and ids is not None and ids.ndim == 2:
            self._check_logits_size(name, ids.shape[0], ids.shape[1])
        return counted

    def _check_logits_size(self, name: str, rows: int, positions: int) -> None:
        """positions <= context; rows x positions x vocab x 20 bytes <= max_response_bytes."""
        if self.context and positions > self.context:
            raise BadRequest(
                f"input_ids has {positions} positions; {name} takes at most {self.context} "
                "(the model's context, max_position_embeddings)")
        vocab = self.logits_signatures[name] or self.vocab_size
        if not vocab:
            return
        size, cap = rows * positions * vocab * JSON_BYTES_PER_FLOAT, self.serve.max_response_bytes
        if size > cap:
            most = max(cap // (positions * vocab * JSON_BYTES_PER_FLOAT), 0)
            raise BadRequest(
                f"the {name} reply would be about {size / 2**20:.0f} MiB ({rows} rows x "
                f"{positions} positions x vocab_size {vocab} x {JSON_BYTES_PER_FLOAT} bytes "
                f"per float in JSON), over max_response_bytes={cap}: ask for at most "
                f"{most} rows of {positions} positions, fewer positions, or generated text "
                "(the generate signature)")

    def _check_room(self, name: str, inputs: dict[str, np.ndarray], rows: int) -> int:
        """max_new_tokens in [1, context - prompt tokens], for every prompt; returns the
        prompts' tokens (0 when there is nothing to check)."""
        if "max_new_tokens" in inputs:
            new = np.broadcast_to(inputs["max_new_tokens"], [rows])
        elif name == "serving_default" and self.default_max_new_tokens:
            new = np.full([rows], self.default_max_new_tokens)
        else:
            return 0
        templated = self.chat_prompt is not None and name != "generate_raw"
        prompts = list(inputs["prompt"])
        if templated:
            prefix, suffix = (s.encode("utf-8") for s in self.chat_prompt)
            prompts = [prefix + p + suffix for p in prompts]
        lengths = self.signatures["tokenize"](text=tf.constant(prompts))["lengths"].numpy()
        used = lengths + (0 if templated else 1)  # a plain prompt starts with [EOS]
        seen = "in the chat template" if templated else "with the [EOS] separator first"
        for i in range(rows):
            room, at = self.context - int(used[i]), f" (prompt {i})" if rows > 1 else ""
            if 1 <= new[i] <= room:
                continue
            if "max_new_tokens" not in inputs:
                raise BadRequest(
                    f"prompt is {used[i]} tokens ({seen}){at}; {name} generates "
                    f"max_new_tokens={new[i]} (the model's generation defaults), so the prompt "
                    f"may have at most {self.context - int(new[i])} tokens of the "
                    f"{self.context}-token context (max_position_embeddings); the generate "
                    "signature takes a smaller max_new_tokens")
            if room < 1:
                raise BadRequest(
                    f"prompt is {used[i]} tokens ({seen}){at}; with max_new_tokens={new[i]} "
                    f"it may have at most {self.context - max(int(new[i]), 1)} tokens of the "
                    f"{self.context}-token context (max_position_embeddings)")
            raise BadRequest(
                f"max_new_tokens={new[i]} must be in [1, {room}]{at}: the prompt is {used[i]} "
                f"tokens ({seen}) of the {self.context}-token context "
                "(max_position_embeddings)")
        return int(used.sum())
