"""The Keras and TensorFlow internals `models/layers/tracking.py` relies on.

Keras 3 on TensorFlow leaves a layer's list attributes out of
`tf.train.Checkpoint` (keras-team/keras#19425, open), so the model's decoder
blocks and experts would be missing from every checkpoint. `models/layers/tracking.py` adds
them back through internals of the pinned Keras (3.6.0) and of
`tf.__internal__`. These tests pin each internal, so that a Keras or TensorFlow
upgrade fails here, loudly and with what to do, instead of writing checkpoints
that silently lack most of the model.
"""

import keras
import pytest
import tensorflow as tf

from models.layers.tracking import no_default_save_signature, with_layer_lists

ISSUE = "keras-team/keras#19425"


def changed(what: str) -> str:
    """The failure message when an internal `tracking.py` relies on changed."""
    return (
        f"Keras {keras.__version__} / TensorFlow {tf.__version__} changed an internal that "
        f"models/layers/tracking.py relies on (the workaround for {ISSUE}: a Layer's list "
        f"attributes are missing from tf.train.Checkpoint): {what}. Without it checkpoints "
        f"silently lose every decoder block and expert. If {ISSUE} is fixed in this Keras, "
        "delete models/layers/tracking.py and the `_trackable_children` override in "
        "models/layers/causal_lm_base.py; otherwise adapt tracking.py to the new "
        "internal. Either way, check that checkpoint keys are unchanged "
        "(`model/decoder_layers/0/...`), so existing checkpoints still restore."
    )


FIXED = (
    f"{ISSUE} looks fixed in Keras {keras.__version__}: the base `_trackable_children"
    "('checkpoint')` now lists a layer's list attributes. Delete models/layers/tracking.py "
    "and the `_trackable_children` override in models/layers/causal_lm_base.py, then "
    "check that checkpoint keys are unchanged (`model/decoder_layers/0/...`), so existing "
    "checkpoints still restore, and that test_deepseek_causal_lm.py::"
    "test_tf_train_checkpoint_covers_every_weight passes."
)


class _Stack(keras.layers.Layer):
    """Two Dense blocks in a list, like DeepSeekCausalLM.decoder_layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [keras.layers.Dense(3, name="a"), keras.layers.Dense(3, name="b")]

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class _TrackedStack(_Stack):
    """`_Stack` with the override of causal_lm.py."""

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        return with_layer_lists(self, children, save_type)


def _built(cls):
    layer = cls(name="stack")
    layer(tf.zeros((1, 2)))
    return layer


def test_keras_names_list_attributes_in_tracked():
    layer = _built(_Stack)
    # Keras' TF backend records the names of its TrackedList/Dict/Set attributes
    # in `Layer._tracked` (keras/src/backend/tensorflow/trackable.py).
    assert "blocks" in getattr(layer, "_tracked", ()), changed(
        "`Layer._tracked` no longer names list attributes")
    assert isinstance(layer.blocks, list), changed(
        "a list attribute is no longer a `list` (TrackedList)")


def test_keras_checkpoint_children_still_leave_lists_out():
    layer = _built(_Stack)
    # The bug itself: the checkpoint view lacks the list; the SavedModel view has it.
    assert "blocks" not in layer._trackable_children("checkpoint"), FIXED
    saved = layer._trackable_children("savedmodel")
    assert list(saved.get("blocks", ())) == list(layer.blocks), changed(
        "`_trackable_children('savedmodel')` no longer exposes list attributes")


def test_tf_internal_wrap_numbers_list_elements():
    layer = _built(_Stack)
    tracking = getattr(tf.__internal__, "tracking", None)
    assert hasattr(tracking, "Trackable") and hasattr(tracking, "wrap"), changed(
        "`tf.__internal__.tracking.Trackable` or `.wrap` is gone")
    assert all(isinstance(block, tracking.Trackable) for block in layer.blocks)
    wrapped = tracking.wrap(list(layer.blocks))
    assert isinstance(wrapped, tracking.Trackable), changed(
        "`tf.__internal__.tracking.wrap(list)` no longer returns a Trackable")
    children = wrapped._trackable_children()
    assert list(children) == ["0", "1"], changed(
        f"a wrapped list's children are {list(children)}, not '0', '1'")
    assert [children["0"], children["1"]] == list(layer.blocks)


def test_checkpoint_keys_are_the_saved_models(tmp_path):
    layer = _built(_TrackedStack)
    path = tf.train.Checkpoint(model=layer).save(str(tmp_path / "ckpt"))
    in_checkpoint = {name.removeprefix("model/") for name, _ in tf.train.list_variables(path)
                     if name.startswith("model/")}
    tf.saved_model.save(layer, str(tmp_path / "saved"))
    in_saved_model = {name for name, _ in
                      tf.train.list_variables(str(tmp_path / "saved/variables/variables"))
                      if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}
    assert len(in_checkpoint) == len(layer.weights) == 4, changed(
        f"tf.train.Checkpoint saved {sorted(in_checkpoint)}")
    assert in_checkpoint == in_saved_model, changed(
        f"checkpoint keys {sorted(in_checkpoint)} differ from the SavedModel's "
        f"{sorted(in_saved_model)}")
    assert any(name.startswith("blocks/0/") for name in in_checkpoint)
    # Without the override the blocks are missing: the reason `_tracking.py` exists.
    bare = _built(_Stack)
    path = tf.train.Checkpoint(model=bare).save(str(tmp_path / "bare"))
    assert not [name for name, _ in tf.train.list_variables(path)
                if name.startswith("model/blocks/")], FIXED


@pytest.mark.slow
def test_the_keras_internals_of_expert_projection_are_as_pinned():
    """`ExpertProjection` (stacked experts) adds LoRA weights after build by unlocking the
    layer's `_tracker`, as Keras' Dense.enable_lora does, and marks itself quantized with
    `_is_quantized`, which Keras' dtype-policy setter reads, as Dense.quantize does."""
    from models.layers.expert_projection import ExpertProjection

    what = ("models/layers/expert_projection.py uses Keras' private `Layer._tracker` "
            "(lock/unlock/locked) and `_is_quantized`, as keras.layers.Dense does; adapt "
            "ExpertProjection.enable_lora / quantize to this Keras ({})")
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    tracker = getattr(layer, "_tracker", None)
    assert tracker is not None and tracker.locked, what.format("no locked _tracker after build")
    assert callable(getattr(tracker, "unlock", None)) and callable(getattr(tracker, "lock", None)), \
        what.format("_tracker has no unlock/lock")
    layer.quantize("int8")
    assert getattr(layer, "_is_quantized", None) is True, what.format("Dense sets no _is_quantized")

    projection = ExpertProjection(2, 3, 4)
    projection.build()
    projection.enable_lora(1)
    assert projection._tracker.locked, what.format("enable_lora left the tracker unlocked")
    projection = ExpertProjection(2, 3, 4)
    projection.build()
    projection.quantize("int8")
    assert projection.quantization_mode == "int8", what.format("quantize set no int8 policy")
    assert projection.kernel_variable().dtype == "int8" and len(projection.weights) == 2, \
        what.format("the int8 policy quantized the layer a second time")


class _Model(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


class _ModelWithoutSignature(_Model):
    """`_Model` with the override of causal_lm.py."""

    _default_save_signature = property(no_default_save_signature)


def _saved_functions(model, tmp_path) -> list[str]:
    """The names of the functions a SavedModel holds on `model`, saved as a child of a
    module (as savedmodel/export.py saves our causal LMs)."""
    model(tf.zeros((1, 3)))
    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path)).model
    return [name for name in dir(loaded)
            if isinstance(getattr(loaded, name, None), (tf.types.experimental.GenericFunction,
                                                        tf.types.experimental.ConcreteFunction))]


def test_keras_still_traces_a_default_signature_that_the_override_removes(tmp_path):
    """Keras' TF backend gives every built Model `_default_save_signature`, a tf.function
    of its `call`, which TensorFlow traces into any SavedModel holding the model; our
    causal LMs replace the property with `no_default_save_signature` (tracking.py)."""
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    what = ("Keras' private `_default_save_signature` property ({}): if Keras no longer "
            "traces a built Model's `call` into SavedModels, delete the override in "
            "models/layers/causal_lm_base.py and "
            "`no_default_save_signature` in tracking.py; if it renamed the property, "
            "override the new name")
    assert _saved_functions(_Model(name="plain"), tmp_path / "keras") == ["_default_save_signature"], \
        what.format("a plain Model saved no default signature, or others")
    assert _saved_functions(_ModelWithoutSignature(name="ours"), tmp_path / "ours") == [], \
        what.format("the override left functions in the SavedModel")
    for cls in (DeepSeekCausalLM, DeepSeekV4CausalLM):
        assert cls._default_save_signature.fget is no_default_save_signature, cls.__name__
