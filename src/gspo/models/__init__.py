"""Policy models and tokenizers: the character tokenizer (``char_tokenizer``), tiny models
(``tiny_model``, ``moe``, ``vision``, ``vision_qwen``), checkpoint I/O (``model_io``, ``pretrained``),
a run's policy (``policy``), chat templates (``chat``), LoRA (``lora``), and ``token_logprobs``
(``logprobs``), the one forward pass the trainer uses to score completions.

Nothing here touches the network: tiny models are built from a config and the tokenizer from the
``tokenizers`` library; checkpoints are loaded with ``local_files_only=True``.
"""
