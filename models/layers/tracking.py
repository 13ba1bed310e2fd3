"""Makes layers held in Python lists visible to `tf.train.Checkpoint`.

Keras 3.6 wraps a list attribute of a layer in a `TrackedList`, which its
TensorFlow backend exposes to TF's object graph only when exporting a
SavedModel (`TFLayer._trackable_children`), not when writing a checkpoint: a
`tf.train.Checkpoint(model=...)` would silently skip every decoder block and
expert. Layers that hold lists of sublayers call this from their
`_trackable_children` override.

The lists are exposed exactly as a SavedModel exposes them (a TF `ListWrapper`
whose children are "0", "1", ...), so checkpoint keys and the keys of a
SavedModel's `variables/` agree (`model/decoder_layers/0/self_attn/...`), and a
SavedModel's weights can be read back into a freshly built model with
`tf.train.Checkpoint(model=model).read(<saved_model>/variables/variables)`.

`no_default_save_signature` is the second workaround: Keras' TensorFlow backend gives
every built Model a `_default_save_signature` property, a `tf.function` of the
model's `call` that TensorFlow traces into any SavedModel holding the model, even as a
child of another module with its own signatures. Our SavedModels (savedmodel/
export.py, hf_interop.py) serve their own `logits`, `generate`, ... signatures, so that
trace is dead weight. For `tiny_v4` (medians of four side-by-side pairs, 2 cores): the
export took 13.2 s with it and 11.9 s without, its saved_model.pb 5.1 and 4.2 MB, and
`tf.saved_model.load` 4.2 and 3.7 s.

Why a workaround: the bug is keras-team/keras#19425 (open at Keras 3.6), and
the fix here leans on internals, Keras' `Layer._tracked` and
`_trackable_children` and TensorFlow's `tf.__internal__.tracking`; and Keras'
`_default_save_signature`.
tests/models/test_tracking.py pins each of them on the pinned Keras and fails,
naming the issue and what to do, when an upgrade changes one or fixes the bug
(then `with_layer_lists` and `CausalLMBase._trackable_children` go; the
`_default_save_signature` override of `CausalLMBase` goes when Keras stops tracing `call`
into SavedModels).
"""

import tensorflow as tf


def with_layer_lists(layer, children, save_type):
    """Adds the elements of each list attribute of `layer` to `children`.

    Element i of list `decoder_layers` becomes `decoder_layers/i` (checkpoint
    keys like `model/decoder_layers/0/self_attn/...`, as in a SavedModel).

    Args:
      layer: a Keras 3 layer on the TensorFlow backend.
      children: dict from the base `_trackable_children`.
      save_type: "checkpoint" or "savedmodel" (the base already handles the latter).

    Returns:
      `children`, extended for checkpoints.
    """
    if save_type == "checkpoint":
        # One wrapper per list, kept on the layer (outside Keras' attribute
        # tracking) so every traversal sees the same object.
        wrappers = layer.__dict__.setdefault("_checkpoint_list_wrappers", {})
        for name in getattr(layer, "_tracked", []):
            value = getattr(layer, name, None)
            if isinstance(value, list) and any(
                    isinstance(item, tf.__internal__.tracking.Trackable) for item in value):
                if name not in wrappers:
                    wrappers[name] = tf.__internal__.tracking.wrap(list(value))
                children.setdefault(name, wrappers[name])
    return children


def no_default_save_signature(layer):
    """The `_default_save_signature` of our causal LMs: none (the module docstring).

    Used as `_default_save_signature = property(no_default_save_signature)`; a
    SavedModel holding the model then has only the functions its module defines.
    tests/models/test_tracking.py pins Keras' property and checks an exported model.
    """
    del layer
    return None
