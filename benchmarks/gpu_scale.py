"""The engine at a real model's size on one GPU: RL step time and peak GPU memory per setting.

Builds a randomly initialised Qwen2.5-VL model with a real checkpoint's shapes (no download: the
testbed's character tokenizer and image processor, its vocabulary padded to the real size, the
padded ids suppressed in sampling as for any checkpoint), then runs `grpo_zoo.trainer.train` for a
few steps per arm on the testbed's questions with the hf rollout backend. A random model answers
nothing right, so the numbers are speed and memory only; every response runs to max_new_tokens
(EOS is rare from random weights), the worst case for a step.

Arms (each a fresh train() in this process, run one after another; a GPU held alone drifts far
less than the shared CPUs, and each arm's first step is left out as warm-up):
  sharing        the default: prefix sharing, bfloat16, full fine-tuning
  plain          model.prefix_sharing=false (HF generate, one full forward per row)
  checkpointing  the default + model.gradient_checkpointing=true
  lora           the default + LoRA r=16 on the attention projections

    python benchmarks/gpu_scale.py [--shape qwen2.5-vl-3b] [--steps 4] [--questions 16] [--group 8]
        [--max-new-tokens 128] [--arms sharing,plain,checkpointing,lora] [--out result.json]

`--shape tiny` runs the same on the testbed's sizes (seconds; on a CPU too), to check the script.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    # Qwen2.5-VL-3B-Instruct's config.json: text 36 x 2048 (GQA 16/2 heads, MLP 11008, tied embeddings),
    # vision 32 x 1280 (MLP 3420, windowed attention, full attention in blocks 7, 15, 23, 31).
    "qwen2.5-vl-3b": dict(spec=dict(hidden=2048, layers=36, heads=16, kv_heads=2, mlp=11008, mrope_section=(16, 24, 24),
                                    rope_theta=1e6, vision_hidden=1280, vision_depth=32, vision_heads=16,
                                    vision_mlp=3420), vocab=151936, full_attention=[7, 15, 23, 31]),
    "tiny": dict(spec={}, vocab=0, full_attention=None),
}
ARMS = {
    "sharing": [],
    "plain": ["model.prefix_sharing=false"],
    "checkpointing": ["model.gradient_checkpointing=true"],
    "lora": ["model.lora.enabled=true", "model.lora.r=16", "model.lora.alpha=32"],
}


def build_model(shape: str, out_dir: Path, dtype: torch.dtype, device: str) -> tuple[Path, int]:
    """A random Qwen2.5-VL checkpoint of `shape`'s sizes, initialised on `device` in `dtype`, saved; its size."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from grpo_zoo.testbed.tiny_model import (
        TinyVLMSpec,
        generation_config,
        special_token_ids,
        tiny_config,
        tiny_processor,
    )
    from grpo_zoo.testbed.tokenizer import build_tokenizer

    entry = SHAPES[shape]
    spec = TinyVLMSpec(**entry["spec"])
    tokenizer = build_tokenizer()
    ids = special_token_ids(tokenizer)
    config = tiny_config(spec, max(entry["vocab"], len(tokenizer)), ids)
    if entry["full_attention"]:
        config.vision_config.fullatt_block_indexes = entry["full_attention"]
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype).eval()
    model.generation_config = generation_config(ids)
    processor = tiny_processor(spec, tokenizer)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out_dir, parameters


def run_arm(model_dir: Path, work: Path, arm: str, args: argparse.Namespace) -> dict:
    from grpo_zoo.config import load_config
    from grpo_zoo.trainer import train

    overrides = [
        f"model.path={model_dir}", f"model.dtype={args.dtype}", f"model.device={args.device}",
        "algorithm.estimator=grpo", "algorithm.selector=uniform", "algorithm.loss=ppo_clip",
        f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"train.questions_per_step={args.questions}", f"train.steps={args.steps}",
        f"train.micro_batch_size={args.micro_batch}", "eval.num_questions=0", "eval.at_start=false",
        "output.tensorboard=false", "output.progress=false", "output.checkpoint_every=0", f"output.dir={work}",
        *ARMS[arm],
    ]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = train(load_config(None, overrides), recipe=f"gpu-scale-{arm}")
    total = time.perf_counter() - started
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(result.run_dir)  # the end-of-run checkpoint (weights + optimizer) of a 3B model is ~20 GB
    steps = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r][1:]  # the first step warms up
    if not steps:
        raise SystemExit(f"arm {arm}: no timed step (use --steps >= 2)")
    responses = args.questions * args.group
    step_s = statistics.median(r["time/step_s"] for r in steps)
    out = {
        "arm": arm, "timed_steps": len(steps), "step_s": step_s,
        "rollout_s": statistics.median(r["time/rollout_s"] for r in steps),
        "responses_per_s": responses / step_s,
        "response_tokens_per_s": statistics.median(r["response/length_mean"] * responses / r["time/step_s"]
                                                   for r in steps),
        "loss_finite": all(r.get("train/loss") is None or r["train/loss"] == r["train/loss"] for r in steps),
        "run_s_with_load": total,
    }
    if torch.cuda.is_available():
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-vl-3b", help="model sizes")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per arm (the first is warm-up)")
    parser.add_argument("--questions", type=int, default=16, help="B prompts per step")
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="response length cap")
    parser.add_argument("--micro-batch", type=int, default=32, help="responses per forward/backward")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--device", default="auto", help="auto = cuda when available")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    args.device = device
    with tempfile.TemporaryDirectory(prefix="gpu-scale-") as tmp:
        started = time.perf_counter()
        model_dir, parameters = build_model(args.shape, Path(tmp) / "model", getattr(torch, args.dtype), device)
        print(f"built {args.shape}: {parameters / 1e6:.1f} M parameters in {time.perf_counter() - started:.0f} s",
              flush=True)
        results = [run_arm(model_dir, Path(tmp) / "runs", arm, args) for arm in arms]
    report = {"shape": args.shape, "parameters": parameters, "device": torch.cuda.get_device_name()
              if device.startswith("cuda") else "cpu", "torch": torch.__version__,
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "arms": results}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
