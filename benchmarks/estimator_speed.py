"""Speed of every registered advantage estimator on one CPU thread.

N = 1,000,000 responses in local groups of G = 8 (125,000 prompts), one question per prompt;
estimators that read global groups (diva) also run with questions of 2 prompts (an original
plus one variant, the paper's V = 1). Inputs carry difficulty, seq_logprob and
visual_entropy so every optional view runs. Reports the median milliseconds per call over
--repeats calls (after one warm-up) as a markdown table; target < 200 ms each.

    python benchmarks/estimator_speed.py [--n 1000000] [--group 8] [--repeats 7] [--out speed.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs

TARGET_MS = 200.0
GLOBAL_GROUP_ESTIMATORS = ("diva",)  # estimators worth timing with 2 prompts per question too


def make_inputs(n: int, group: int, prompts_per_question: int, tokens: int, seed: int = 0) -> AdvantageInputs:
    """A synthetic step: binary-ish rewards, rows ordered prompt by prompt as the rollout does."""
    gen = torch.Generator().manual_seed(seed)
    num_prompts = n // group
    n = num_prompts * group
    prompt_ids = torch.arange(num_prompts).repeat_interleave(group)  # [N]
    question_ids = prompt_ids // prompts_per_question  # [N]
    rewards = (torch.rand(n, generator=gen) < 0.5).float() * 0.9 + 0.1 * torch.rand(n, generator=gen)  # [N]
    lengths = torch.randint(1, tokens + 1, (n,), generator=gen)  # [N]
    mask = (torch.arange(tokens).unsqueeze(0) < lengths.unsqueeze(1)).float()  # [N, T]
    per_prompt = torch.rand(num_prompts, generator=gen)  # [B]
    return AdvantageInputs(
        rewards=rewards,
        prompt_ids=prompt_ids,
        question_ids=question_ids,
        response_mask=mask,
        difficulty=(1 + 8 * per_prompt).round().repeat_interleave(group),
        seq_logprob=-50 * torch.rand(n, generator=gen),
        visual_entropy=(3 * per_prompt.flip(0)).repeat_interleave(group),
    )


def time_call(fn, inputs: AdvantageInputs, cfg, repeats: int) -> float:
    """Median wall-clock milliseconds of fn(inputs, cfg) over `repeats` calls after a warm-up."""
    fn(inputs, cfg)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(inputs, cfg)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(n: int, group: int, repeats: int, tokens: int) -> list[dict]:
    torch.set_num_threads(1)
    cases = {1: make_inputs(n, group, 1, tokens), 2: make_inputs(n, group, 2, tokens)}
    rows = []
    for entry in ESTIMATORS.entries():
        variants = (1, 2) if entry.name in GLOBAL_GROUP_ESTIMATORS else (1,)
        for ppq in variants:
            ms = time_call(entry.obj, cases[ppq], entry.config_cls(), repeats)
            rows.append({"estimator": entry.name, "prompts_per_question": ppq, "n": cases[ppq].num_responses,
                         "group": group, "median_ms": round(ms, 2), "under_target": ms < TARGET_MS})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| estimator | prompts/question | N | G | median ms | < 200 ms |", "|---|---|---|---|---|---|"]
    for r in rows:
        ok = "yes" if r["under_target"] else "NO"
        lines.append(f"| {r['estimator']} | {r['prompts_per_question']} | {r['n']:,} | {r['group']} | "
                     f"{r['median_ms']:.1f} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="responses per call")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (G)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per estimator (median reported)")
    parser.add_argument("--tokens", type=int, default=16, help="T of the response mask (only lengths matter)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.n, args.group, args.repeats, args.tokens)
    print(f"torch {torch.__version__}, 1 thread")
    print(markdown(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
