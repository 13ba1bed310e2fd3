"""Makes layers held in Python lists visible to `tf.train.Checkpoint`.

Keras 3.6 wraps a list attribute of a layer in a `TrackedList`, which its
TensorFlow backend exposes to TF's object graph only when exporting a
SavedModel (`TFLayer._trackable_children`), not when writing a checkpoint: a
`tf.train.Checkpoint(model=...)` would silently skip every decoder block and
expert. Layers that hold lists of sublayers call this from their
`_trackable_children` override.
"""

import tensorflow as tf


def with_layer_lists(layer, children, save_type):
    """Adds the elements of each list attribute of `layer` to `children`.

    Element i of list `decoder_layers` becomes the child `decoder_layers.i`
    (checkpoint keys like `model/decoder_layers.0/self_attn/...`).

    Args:
      layer: a Keras 3 layer on the TensorFlow backend.
      children: dict from the base `_trackable_children`.
      save_type: "checkpoint" or "savedmodel" (the base already handles the latter).

    Returns:
      `children`, extended for checkpoints.
    """
    if save_type == "checkpoint":
        for name in getattr(layer, "_tracked", []):
            value = getattr(layer, name, None)
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, tf.__internal__.tracking.Trackable):
                        children.setdefault(f"{name}.{i}", item)
    return children
