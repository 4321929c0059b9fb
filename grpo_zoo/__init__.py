"""grpo_zoo: GRPO-family RL for (multimodal) language models, every algorithm on one engine."""

__version__ = "0.1.0"
