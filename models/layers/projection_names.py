"""The attribute names of the Dense projections a V2/V3 decoder block holds.

`models.formats.quantization` quantizes these layers to int8 and the trainer's LoRA
adapters (`components/trainer/trainable.py`) wrap them; both read the names here.
HF transformers `modeling_deepseek_v3.py` names them the same.
"""

ATTENTION_PROJECTIONS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                         "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
