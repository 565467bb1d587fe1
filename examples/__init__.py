"""Example training functions to audit with dpaudit: ``FUNCTION(model, x, y, seed) -> trained copy of model``.

- :mod:`examples.opacus_trainer`: DP-SGD through ``opacus.PrivacyEngine`` (Poisson sampling).
- :mod:`examples.dpsgd_handwritten`: DP-SGD in plain torch, with planted bugs to find.
- :mod:`examples.hf_lora`: Hugging Face causal LMs (GPT-2, Llama) with peft LoRA on token windows, DP-SGD or not.
- :mod:`examples.models`: a small model factory, ``mlp(input_shape, num_classes)``.
"""
