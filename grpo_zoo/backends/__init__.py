"""Execution backends: rollout engines (hf, ray, vllm), Ray workers, distributed training."""
