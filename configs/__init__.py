"""Shipped YAML recipes (installed as grpo_zoo.configs so `grpo-zoo train` finds its default)."""
