"""Training-step throughput: grpo_zoo's step vs the bare-model limit vs TRL's GRPOTrainer (issue #10).

Arms, all on the same tiny random model (same weights, loaded from one directory), the same B
prompts x G responses and exactly max_new_tokens generated tokens per response:
  grpo_zoo  grpo_zoo.trainer.training_step on a Run built from a recipe (GRPO estimator, uniform
            selector, ppo_clip loss, one on-policy update, no KL, rewards scored in-process),
            with prefix sharing (each prompt run once, its G responses on its cached keys/values).
  grpo_zoo_no_sharing  the same with model.prefix_sharing=false: HF generate and one full
            prompt + response forward per row, as the limit does.
  limit     the bare-model limit: one batched model.generate of B*G sequences, then one
            forward + backward + AdamW step on that batch (a REINFORCE-style loss with fixed
            advantages); no trainer, no rewards, no grad clipping.
  trl       trl.GRPOTrainer with per_device_train_batch_size = B*G, num_generations = G, in a
            subprocess of a separate venv, bf16 and gradient checkpointing off, one generation and
            one optimizer step per training step; timed from on_step_begin to on_step_end.
Equal lengths: every arm suppresses the EOS ids in sampling (the same `suppress_tokens` list,
grpo_zoo's own vision/unknown-token list plus EOS), so every response runs to max_new_tokens;
each arm checks its generated lengths and fails loudly otherwise. Sampling is plain
softmax(logits) everywhere (temperature 1, top_p 1, top_k 0).

Arms run interleaved (grpo_zoo, limit, trl, grpo_zoo, ...) after one warm-up step each; the
report gives per-arm median step time, responses/s, tokens/s and ratios to the limit.
`--limit-variants` instead times pushes of the limit (static KV cache, bf16 autocast, and,
with natural EOS, a decode loop that drops finished sequences vs HF generate), as ratios.

`--model text` (default) uses a tiny Qwen2 causal LM with the testbed's sizes and character
tokenizer and equal-length arithmetic prompts (no padding); `--model vlm` the testbed's tiny
Qwen2.5-VL (build_tiny_vlm) on testbed image questions, where the TRL arm is skipped (TRL's
VLM path is not what this compares) and the limit arm encodes each row's image (no sharing).

The TRL arm needs a venv (outside the repo, nothing else changes):
    python -m venv --system-site-packages ~/.cache/grpo_zoo/venv-trl
    ~/.cache/grpo_zoo/venv-trl/bin/pip install trl
and is skipped with a message when that python (or --trl-python) is absent.

    python benchmarks/engine_throughput.py [--model text] [--questions 8] [--group 8] [--max-new-tokens 48]
        [--repeats 15] [--threads 2] [--limit-variants] [--trl-python PATH] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DEFAULT_TRL_PYTHON = Path("~/.cache/grpo_zoo/venv-trl/bin/python").expanduser()
WORKER_TAG = "@@engine_throughput@@ "  # marks the TRL worker's result lines among library output
TARGET_RATIO = 1.05  # issue #10: grpo_zoo's step within 1.05x of the limit


@dataclass(frozen=True)
class Setup:
    """One benchmark configuration, shared by every arm (and sent to the TRL worker as JSON)."""

    model: str  # "text" (tiny Qwen2 causal LM) or "vlm" (tiny Qwen2.5-VL)
    questions: int  # B prompts per step
    group: int  # G responses per prompt
    max_new_tokens: int  # T: every response has exactly this many tokens (EOS suppressed)
    threads: int  # torch intra-op threads in every process
    lr: float = 1e-5  # the same AdamW lr in every arm; its value does not change the speed
    seed: int = 0

    @property
    def responses(self) -> int:
        return self.questions * self.group


# --------------------------------------------------------------------------------------
# The model and the prompts
# --------------------------------------------------------------------------------------


def build_text_model(out_dir: Path, seed: int) -> Path:
    """A tiny random Qwen2 causal LM with the testbed VLM's text sizes and its character tokenizer."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from grpo_zoo.testbed.tiny_model import TinyVLMSpec
    from grpo_zoo.testbed.tokenizer import build_tokenizer

    spec, tokenizer = TinyVLMSpec(), build_tokenizer()
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.mlp,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
                         bos_token_id=None, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def write_text_questions(path: Path, n: int, seed: int) -> Path:
    """n arithmetic questions of identical character length (so no prompt needs padding)."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    return path


def prepare(setup: Setup, workdir: Path) -> tuple[Path, str]:
    """(model directory, data.train value) for `setup.model`."""
    if setup.model == "vlm":
        from grpo_zoo.testbed.tiny_model import build_tiny_vlm

        return build_tiny_vlm(workdir / "model", seed=setup.seed), "testbed"
    model_dir = build_text_model(workdir / "model", setup.seed)
    return model_dir, str(write_text_questions(workdir / "questions.jsonl", 256, setup.seed))


def suppressed_ids(policy) -> list[int]:
    """grpo_zoo's never-sampled ids plus every EOS id: responses then always reach max_new_tokens."""
    return sorted(set(policy.suppressed_token_ids) | set(policy.eos_token_ids))


def sampling_config(setup: Setup, policy, *, suppress_eos: bool = True, cache: str | None = None):
    """The GenerationConfig every arm samples with: plain softmax, nothing reshaped."""
    from transformers import GenerationConfig

    suppress = suppressed_ids(policy) if suppress_eos else policy.suppressed_token_ids
    return GenerationConfig(do_sample=True, max_new_tokens=setup.max_new_tokens, temperature=1.0, top_p=1.0,
                            top_k=0, min_p=0.0, typical_p=1.0, repetition_penalty=1.0, num_beams=1,
                            eos_token_id=policy.eos_token_ids, pad_token_id=policy.pad_token_id,
                            suppress_tokens=suppress or None, cache_implementation=cache)


# --------------------------------------------------------------------------------------
# Arm: grpo_zoo's training step
# --------------------------------------------------------------------------------------


def grpo_zoo_arm(setup: Setup, model_dir: Path, data: str, workdir: Path,
                 prefix_sharing: bool = True) -> Callable[[], dict]:
    """One grpo_zoo.trainer.training_step per call, on a Run built from a recipe."""
    from grpo_zoo.config import load_config
    from grpo_zoo.run import build_run
    from grpo_zoo.trainer import training_step

    overrides = [
        f"model.path={model_dir}", f"data.train={data}", f"data.eval={data}", "model.device=cpu",
        "algorithm.estimator=grpo", "algorithm.selector=uniform", "algorithm.loss=ppo_clip",
        f"train.questions_per_step={setup.questions}", f"rollout.group_size={setup.group}",
        f"rollout.max_new_tokens={setup.max_new_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        f"train.lr={setup.lr}", "train.kl_coef=0", f"train.seed={setup.seed}", "train.steps=1000000",
        "testbed.train_questions=64", "testbed.eval_questions=8", "eval.num_questions=8", "eval.at_start=false",
        "reward.num_workers=0", "output.tensorboard=false", "output.progress=false",
        f"model.prefix_sharing={str(prefix_sharing).lower()}",
    ]
    run_dir = workdir / ("run" if prefix_sharing else "run-no-sharing")
    cfg = load_config(None, [*overrides, f"output.dir={run_dir}"])
    run_dir.mkdir(exist_ok=True)
    run = build_run(cfg, run_dir)
    run.policy.suppressed_token_ids = suppressed_ids(run.policy)  # the EOS-suppressed setting (see docstring)
    step = 0

    def one_step() -> dict:
        nonlocal step
        run.step = step
        start = time.perf_counter()
        metrics = training_step(run, step)
        seconds = time.perf_counter() - start
        step += 1
        responses = int(metrics["rollout/responses"])
        check_lengths("grpo_zoo", setup, responses, metrics["response/length_mean"], metrics["response/length_max"])
        return {"seconds": seconds, "responses": responses, "tokens": responses * setup.max_new_tokens}

    return one_step


def check_lengths(arm: str, setup: Setup, responses: int, mean_len: float, extreme_len: float) -> None:
    """Every arm must generate B*G responses of exactly T tokens, or the comparison is void.

    `extreme_len` is the shortest or the longest response (whichever the arm reports): with
    mean = T and no response longer than T, every response is T long.
    """
    t = setup.max_new_tokens
    if responses != setup.responses or abs(mean_len - t) > 1e-6 or abs(extreme_len - t) > 1e-6:
        raise RuntimeError(f"arm {arm}: generated {responses} responses of mean length {mean_len} (min or max "
                           f"{extreme_len}); expected {setup.responses} of exactly {t} tokens")


# --------------------------------------------------------------------------------------
# Arm: the bare-model limit (and its pushes)
# --------------------------------------------------------------------------------------


@dataclass
class LimitBatch:
    """The limit's fixed inputs: B*G prompt rows (prompt-major), already collated."""

    model: torch.nn.Module
    policy: object  # a grpo_zoo Policy, used only to encode prompts and for its token ids
    inputs: dict  # input_ids [N, L], attention_mask [N, L] (+ pixel_values, image_grid_thw, ... for a VLM)
    optimizer: torch.optim.Optimizer


def limit_batch(setup: Setup, model_dir: Path, data: str) -> LimitBatch:
    """Load a fresh copy of the model and collate B prompts, each repeated G times."""
    from grpo_zoo.config import load_config
    from grpo_zoo.data import load_questions
    from grpo_zoo.policy import Policy, collate_prompts
    from grpo_zoo.types import Prompt

    cfg = load_config(None, [f"data.train={data}", "testbed.train_questions=64"])
    questions, _ = load_questions(data, cfg.data, cfg.testbed, "train")
    prompts = [Prompt(q.question_id, q.problem, q.answer, list(q.images)) for q in questions[: setup.questions]]
    policy = Policy.from_pretrained(str(model_dir), device="cpu")
    encoded = policy.encode(prompts, template=cfg.data.prompt_template)
    rows = torch.arange(setup.questions).repeat_interleave(setup.group).tolist()
    inputs = collate_prompts([encoded.token_ids[i] for i in rows], [encoded.model_inputs[i] for i in rows],
                             policy.pad_token_id)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=setup.lr)
    return LimitBatch(policy.model, policy, inputs, optimizer)


def limit_step(setup: Setup, lb: LimitBatch, gen_config, *, generate: Callable | None = None,
               autocast: bool = False) -> dict:
    """One batched generate of B*G rows + one forward/backward/AdamW step on them.

    `generate(model, inputs, gen_config)` -> [N, T] response ids replaces HF generate (the
    dropping-finished loop); `autocast` runs the whole step under CPU bf16 autocast.
    """
    from grpo_zoo.policy import TOKEN_ALIGNED

    model, inputs = lb.model, lb.inputs
    eos = torch.tensor(lb.policy.eos_token_ids)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        start = time.perf_counter()
        with torch.no_grad():
            if generate is None:
                response = model.generate(**inputs, generation_config=gen_config)[:, inputs["input_ids"].shape[1]:]
            else:
                response = generate(model, inputs, gen_config)
        is_eos = torch.isin(response, eos).long()
        mask = ((is_eos.cumsum(-1) - is_eos) == 0).long()  # [N, T] up to and including the first EOS
        width = response.shape[1]
        ids = torch.cat([inputs["input_ids"], response], dim=1)
        attention = torch.cat([inputs["attention_mask"], mask], dim=1)
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        for key in TOKEN_ALIGNED:  # per-token modality ids (Qwen-VL): the response is text (0)
            if key in extra:
                extra[key] = torch.nn.functional.pad(extra[key], (0, width))
        if "image_grid_thw" not in extra:  # text: positions as generate counted them; a VLM derives its own
            extra["position_ids"] = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=width + 1, **extra).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        advantages = torch.linspace(-1, 1, response.shape[0]).unsqueeze(1)  # [N, 1] fixed: no rewards here
        loss = -(advantages * logp * mask).sum() / mask.sum()
    lb.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    lb.optimizer.step()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "responses": int(response.shape[0]), "tokens": int(mask.sum())}


def limit_arm(setup: Setup, model_dir: Path, data: str) -> Callable[[], dict]:
    """One limit step per call (EOS suppressed, dynamic cache, fp32), its lengths checked."""
    lb = limit_batch(setup, model_dir, data)
    gen_config = sampling_config(setup, lb.policy)

    def one_step() -> dict:
        out = limit_step(setup, lb, gen_config)
        check_lengths("limit", setup, out["responses"], out["tokens"] / out["responses"],
                      out["tokens"] / out["responses"])
        return out

    return one_step


DROP_SHARE = 0.25  # compact the batch once this share of its rows has finished (each compaction copies the cache)


@torch.no_grad()
def generate_dropping_finished(model: torch.nn.Module, inputs: dict, gen_config) -> torch.Tensor:
    """Sample like HF generate, but remove finished rows from the batch (and its KV cache).

    Rows are dropped in bulk, once DROP_SHARE of the batch has hit EOS, since every drop copies
    the whole cache; a finished row still in the batch is computed but its tokens are not kept.
    Text models only (explicit 1D positions). Returns [N, T] ids, pad after each row's EOS.
    """
    from transformers import DynamicCache

    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    n, t_max = ids.shape[0], gen_config.max_new_tokens
    eos = torch.tensor(gen_config.eos_token_id)
    banned = torch.tensor(gen_config.suppress_tokens or [], dtype=torch.long)
    out = torch.full((n, t_max), gen_config.pad_token_id, dtype=torch.long)
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    alive, last = torch.arange(n), positions[:, -1]
    done = torch.zeros(n, dtype=torch.bool)  # [n_alive] finished but still in the batch
    for t in range(t_max):
        logits = logits.float()
        logits[:, banned] = float("-inf")
        token = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)  # [n_alive]
        out[alive[~done], t] = token[~done]
        done |= torch.isin(token, eos)
        if t == t_max - 1 or done.all():
            break
        if done.float().mean() >= DROP_SHARE:
            rows = (~done).nonzero().flatten()
            cache.batch_select_indices(rows)
            alive, token, mask, last, done = alive[rows], token[rows], mask[rows], last[rows], done[rows]
        mask = torch.cat([mask, torch.ones(len(alive), 1, dtype=mask.dtype)], dim=1)
        last = last + 1
        logits = model(input_ids=token.unsqueeze(1), attention_mask=mask, position_ids=last.unsqueeze(1),
                       past_key_values=cache, use_cache=True).logits[:, -1]
    return out


def bf16_supported() -> bool:
    """CPU bf16 autocast pays only with native bf16 kernels (AVX512-BF16 / AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def limit_variant_arms(setup: Setup, model_dir: Path, data: str) -> dict[str, Callable[[], dict]]:
    """Each push of the limit as its own arm (each with its own model copy and optimizer)."""
    arms: dict[str, Callable[[], dict]] = {}

    def make(name: str, suppress_eos: bool = True, cache: str | None = None, generate=None, autocast=False):
        lb = limit_batch(setup, model_dir, data)
        config = sampling_config(setup, lb.policy, suppress_eos=suppress_eos, cache=cache)
        arms[name] = lambda: limit_step(setup, lb, config, generate=generate, autocast=autocast)

    make("limit")
    make("static_cache", cache="static")
    if bf16_supported():
        make("bf16_autocast", autocast=True)
    else:
        print("engine_throughput: bf16 autocast skipped (torch reports no native CPU bf16 support)")
    make("natural_eos_hf", suppress_eos=False)
    if setup.model == "text":
        make("natural_eos_drop_finished", suppress_eos=False, generate=generate_dropping_finished)
    else:
        print("engine_throughput: the dropping-finished decode loop is text-only (Qwen-VL needs 3D positions)")
    return arms


# --------------------------------------------------------------------------------------
# Arm: TRL's GRPOTrainer, in a subprocess of its own venv
# --------------------------------------------------------------------------------------


class TrlArm:
    """Drives a TRL worker process: one gated GRPOTrainer step per call."""

    def __init__(self, python: Path, setup: Setup, model_dir: Path, data: str, steps: int, workdir: Path):
        spec = {"setup": asdict(setup), "model_dir": str(model_dir), "data": data, "steps": steps,
                "workdir": str(workdir), "suppress": suppressed_ids(_policy_ids(model_dir))}
        self.log = (workdir / "trl_worker.log").open("w")
        self.proc = subprocess.Popen([str(python), __file__, "--trl-worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.setup = setup

    def __call__(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(WORKER_TAG):
                out = json.loads(line[len(WORKER_TAG):])
                check_lengths("trl", self.setup, out["responses"], out["mean_length"], out["min_length"])
                return out
        self.log.flush()
        tail = Path(self.log.name).read_text()[-3000:]
        raise RuntimeError(f"the TRL worker ended without a result (exit {self.proc.wait()}):\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _policy_ids(model_dir: Path):
    """The suppressed/EOS ids of the model, without loading TRL's side (a Policy computes them)."""
    from grpo_zoo.policy import Policy

    return Policy.from_pretrained(str(model_dir), device="cpu")


def trl_worker(spec_json: str) -> None:
    """Runs inside the TRL venv: a GRPOTrainer whose every step waits for a "go" line on stdin."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(spec_json)
    setup = Setup(**spec["setup"])
    torch.set_num_threads(setup.threads)
    torch.set_flush_denormal(True)  # as grpo_zoo's trainer does, so both compute alike
    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]}
                                 for r in rows])

    def accuracy(completions, answer, **_):
        return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]

    args = GRPOConfig(
        output_dir=str(Path(spec["workdir"]) / "trl"), per_device_train_batch_size=setup.responses,
        num_generations=setup.group, max_completion_length=setup.max_new_tokens, max_steps=spec["steps"],
        learning_rate=setup.lr, bf16=False, gradient_checkpointing=False, use_cpu=True, seed=setup.seed,
        save_strategy="no", report_to="none", disable_tqdm=True, temperature=1.0, top_p=1.0, top_k=0,
        generation_kwargs={"suppress_tokens": spec["suppress"]},
    )
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    trainer = GRPOTrainer(model=model, reward_funcs=accuracy, args=args, train_dataset=dataset,
                          processing_class=tokenizer)

    class Gate(TrainerCallback):
        def on_step_begin(self, *_, **__):
            if not sys.stdin.readline():
                sys.exit(0)  # the parent closed the pipe
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            seconds = time.perf_counter() - self.start
            metrics = trainer._metrics["train"]
            out = {"seconds": seconds, "responses": setup.responses,
                   "mean_length": metrics["completions/mean_length"][-1],
                   "min_length": metrics["completions/min_length"][-1]}
            out["tokens"] = round(out["mean_length"] * setup.responses)
            print(WORKER_TAG + json.dumps(out), flush=True)

    trainer.add_callback(Gate())
    trainer.train()


# --------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------


def interleave(arms: dict[str, Callable[[], dict]], repeats: int, warmup: int = 1) -> dict[str, list[dict]]:
    """Warm each arm up, then run them round-robin `repeats` times (noise hits every arm alike)."""
    for _ in range(warmup):
        for fn in arms.values():
            fn()
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(repeats):
        for name, fn in arms.items():
            results[name].append(fn())
            print(f"  repeat {r + 1}/{repeats} {name}: {results[name][-1]['seconds']:.3f} s", flush=True)
    return results


def summarise(results: dict[str, list[dict]], base: str) -> list[dict]:
    """Median step time, responses/s and tokens/s per arm, with the ratio of its median to `base`'s."""
    rows = []
    base_s = statistics.median(r["seconds"] for r in results[base])
    for name, runs in results.items():
        step_s = statistics.median(r["seconds"] for r in runs)
        responses = statistics.median(r["responses"] for r in runs)
        tokens = statistics.median(r["tokens"] for r in runs)
        rows.append({"arm": name, "median_step_s": round(step_s, 4),
                     "responses_per_s": round(responses / step_s, 1), "tokens_per_s": round(tokens / step_s, 1),
                     "mean_tokens_per_response": round(tokens / responses, 2),
                     f"ratio_to_{base}": round(step_s / base_s, 3), "steps_s": [round(r["seconds"], 4) for r in runs]})
    return rows


def markdown(rows: list[dict], base: str) -> str:
    """The summary rows as a markdown table."""
    lines = [f"| arm | median step s | responses/s | tokens/s | tokens/response | step time / {base} |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['median_step_s']:.3f} | {r['responses_per_s']:.1f} | {r['tokens_per_s']:.0f} "
                     f"| {r['mean_tokens_per_response']:.1f} | {r[f'ratio_to_{base}']:.3f} |")
    return "\n".join(lines)


def main_arms(setup: Setup, args: argparse.Namespace, workdir: Path, model_dir: Path, data: str):
    """grpo_zoo, limit and (when its venv exists and the model is text) TRL, interleaved."""
    arms: dict[str, Callable[[], dict]] = {
        "grpo_zoo": grpo_zoo_arm(setup, model_dir, data, workdir),
        "grpo_zoo_no_sharing": grpo_zoo_arm(setup, model_dir, data, workdir, prefix_sharing=False),
        "limit": limit_arm(setup, model_dir, data),
    }
    trl, skipped = None, None
    if args.skip_trl:
        skipped = "--skip-trl"
    elif setup.model != "text":
        skipped = "the TRL arm runs only with --model text"
    elif not args.trl_python.exists():
        skipped = (f"no TRL venv at {args.trl_python}; create it with `python -m venv --system-site-packages "
                   f"{args.trl_python.parent.parent}` and `{args.trl_python.parent / 'pip'} install trl`")
    else:
        trl = TrlArm(args.trl_python, setup, model_dir, data, steps=args.repeats + 1, workdir=workdir)
        arms["trl"] = trl
    if skipped:
        print(f"engine_throughput: TRL arm skipped: {skipped}")
    try:
        results = interleave(arms, args.repeats)
    finally:
        if trl is not None:
            trl.close()
    rows = summarise(results, "limit")
    by_arm = {r["arm"]: r for r in rows}
    verdict = {
        "grpo_zoo_within_1_05_of_limit": by_arm["grpo_zoo"]["ratio_to_limit"] <= TARGET_RATIO,
        "no_sharing_within_1_05_of_limit": by_arm["grpo_zoo_no_sharing"]["ratio_to_limit"] <= TARGET_RATIO,
        "prefix_sharing_speedup": round(by_arm["grpo_zoo_no_sharing"]["median_step_s"]
                                        / by_arm["grpo_zoo"]["median_step_s"], 3),
    }
    if "trl" in by_arm:
        verdict["grpo_zoo_faster_than_trl"] = by_arm["grpo_zoo"]["median_step_s"] < by_arm["trl"]["median_step_s"]
        verdict["trl_over_grpo_zoo"] = round(by_arm["trl"]["median_step_s"] / by_arm["grpo_zoo"]["median_step_s"], 3)
    return rows, {"trl_skipped": skipped, **verdict}


def variant_gains(rows: list[dict]) -> dict[str, float]:
    """Speed-up of each push (old step time / new step time; > 1 = faster)."""
    s = {r["arm"]: r["median_step_s"] for r in rows}
    gains = {f"{k}_speedup": round(s["limit"] / s[k], 3) for k in ("static_cache", "bf16_autocast") if k in s}
    if "natural_eos_drop_finished" in s:
        # Lengths are sampled, so the two arms' token counts differ a little: give both views.
        tps = {r["arm"]: r["tokens_per_s"] for r in rows}
        gains["drop_finished_speedup"] = round(s["natural_eos_hf"] / s["natural_eos_drop_finished"], 3)
        gains["drop_finished_tokens_per_s_gain"] = round(tps["natural_eos_drop_finished"] / tps["natural_eos_hf"], 3)
    return gains


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("text", "vlm"), default="text", help="tiny model kind (see docstring)")
    parser.add_argument("--questions", type=int, default=8, help="B prompts per step")
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="T tokens per response (all arms)")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per arm, interleaved (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in every process")
    parser.add_argument("--limit-variants", action="store_true", help="time pushes of the limit instead of the arms")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON, help="python of the TRL venv")
    parser.add_argument("--skip-trl", action="store_true", help="leave out the TRL arm")
    parser.add_argument("--seed", type=int, default=0, help="model weights and question draw")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # internal: the TRL subprocess
    args = parser.parse_args(argv)
    if args.trl_worker is not None:
        return trl_worker(args.trl_worker)
    for name in ("questions", "group", "max_new_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    setup = Setup(args.model, args.questions, args.group, args.max_new_tokens, args.threads, seed=args.seed)
    torch.set_num_threads(setup.threads)
    torch.set_flush_denormal(True)  # grpo_zoo's train() does this; every arm computes alike
    with tempfile.TemporaryDirectory(prefix="engine_throughput-") as tmp:
        workdir = Path(tmp)
        model_dir, data = prepare(setup, workdir)
        if args.limit_variants:
            rows = summarise(interleave(limit_variant_arms(setup, model_dir, data), args.repeats), "limit")
            extra = {"gains": variant_gains(rows), "bf16_supported": bf16_supported()}
        else:
            rows, extra = main_arms(setup, args, workdir, model_dir, data)
    result = {"setup": asdict(setup), "mode": "limit_variants" if args.limit_variants else "arms",
              "torch": torch.__version__, "cpu_count": os.cpu_count(), "rows": rows, **extra}
    print(f"torch {torch.__version__}, {setup.threads} threads, B={setup.questions} x G={setup.group}, "
          f"T={setup.max_new_tokens}, model {setup.model}, {args.repeats} interleaved repeats")
    print(markdown(rows, "limit"))
    print(json.dumps(extra))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
