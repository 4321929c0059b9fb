"""The testbed base model: the tiny VLM after a short, cached, deterministic supervised warm-up.

ARCHITECTURE.md ("Measured on this kind of machine"): RL needs a base that already samples
right *and* wrong answers to the same question, and DIVA's variants must behave as they do
for an instruct model. So the warm-up teaches, with teacher forcing (loss on response tokens
only), the *imperfect* demonstrations of `task.demonstration` (count errors growing with the
number of shapes, arithmetic slips), on original prompts mixed with paraphrased prompts
(equally hard) and hinted prompts (`variants.add_hint`; the demonstration copies the hinted
steps, so hints make questions easier) — as an instruct model's pre-training would have
shown it. AdamW, lr cosine from `warmup_lr` to `warmup_lr_min`, grad clip, batch 32 run as
two length-sorted micro-batches of 16 (the same gradient, a fifth less time: less padding).

The result is cached under `cache_dir` keyed by a hash of every setting, the model sizes,
the library versions and the source of the code that shapes it; it is written atomically
(temp dir + rename), so an interrupted warm-up never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from grpo_zoo.config import TestbedConfig
from grpo_zoo.types import Prompt, Question, RolloutBatch

WARMUP_FORMAT = 1  # bump to invalidate every cached warm-up when the recipe changes in spirit
DONE_FILE = "warmup.json"  # written last: its presence marks a complete model directory


def _code_version() -> dict[str, str]:
    """Hashes of the code that decides what the warm-up learns (bump WARMUP_FORMAT for the rest)."""
    import inspect

    from grpo_zoo.variants import add_hint

    here = Path(__file__).resolve().parent
    sources = {name: (here / name).read_bytes() for name in ("task.py", "tokenizer.py", "tiny_model.py", "warmup.py",
                                                        "vision_pretrain.py")}
    sources["add_hint"] = inspect.getsource(add_hint).encode()
    return {name: hashlib.sha256(src).hexdigest() for name, src in sources.items()}


def cache_key(cfg: TestbedConfig) -> str:
    """Hash of everything that changes the warm-up result (not the cache dir or the RL/eval pool sizes)."""
    import transformers

    from grpo_zoo.testbed.tiny_model import TinyVLMSpec

    settings = {k: v for k, v in asdict(cfg).items() if k not in ("cache_dir", "eval_questions", "train_questions")}
    payload = {
        "format": WARMUP_FORMAT,
        "settings": settings,
        "spec": asdict(TinyVLMSpec()),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "code": _code_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ensure_testbed_model(cfg: TestbedConfig, log: Callable[[str], None] = print) -> Path:
    """The warmed-up testbed model directory: from the cache, or built, trained and cached now.

    Returns:
        A directory `Policy.from_pretrained` loads; `warmup.json` in it records the settings,
        the loss curve and the time the warm-up took.
    """
    _check(cfg)
    root = Path(cfg.cache_dir).expanduser()
    final = root / f"tiny-vlm-{cache_key(cfg)}"
    if (final / DONE_FILE).is_file():
        log(f"testbed: using the cached warmed-up model {final}")
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warmup-", dir=root))
    try:
        report = _build_and_train(cfg, tmp / "model", log)
        (tmp / "model" / DONE_FILE).write_text(json.dumps(report, indent=1))
        if final.exists() and not (final / DONE_FILE).is_file():
            shutil.rmtree(final)  # a leftover without its marker is not a model
        try:
            (tmp / "model").rename(final)
        except OSError:
            if not (final / DONE_FILE).is_file():  # another process finished first: use theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"testbed: warmed-up model cached at {final}")
    return final


def _check(cfg: TestbedConfig) -> None:
    if cfg.warmup_steps < 0 or cfg.warmup_batch_size < 1 or cfg.warmup_micro_batch_size < 1:
        raise ValueError("testbed.warmup_steps must be >= 0, and testbed.warmup_batch_size and "
                         "warmup_micro_batch_size >= 1")
    if cfg.vision_pretrain_steps < 0 or cfg.vision_pretrain_batch_size < 1 or cfg.vision_pretrain_lr <= 0:
        raise ValueError("testbed.vision_pretrain_steps must be >= 0, vision_pretrain_batch_size >= 1 "
                         "and vision_pretrain_lr > 0")
    if not 0 <= cfg.warmup_hold_share <= 1 or cfg.warmup_vision_lr_mult < 0:
        raise ValueError("testbed.warmup_hold_share must be in [0, 1] and warmup_vision_lr_mult >= 0")
    if not 0 < cfg.warmup_lr_min <= cfg.warmup_lr:
        raise ValueError(f"testbed.warmup_lr_min must be in (0, warmup_lr = {cfg.warmup_lr}], got {cfg.warmup_lr_min}")
    shares = cfg.warmup_hint_share + cfg.warmup_paraphrase_share
    if min(cfg.warmup_hint_share, cfg.warmup_paraphrase_share) < 0 or shares > 1:
        raise ValueError("testbed.warmup_hint_share and warmup_paraphrase_share must be >= 0 and sum to <= 1")
    if cfg.train_questions < 1:
        raise ValueError("testbed.train_questions must be >= 1")


def warmup_example(question: Question, rng: random.Random, cfg: TestbedConfig) -> tuple[Prompt, str]:
    """One (prompt, target) pair: original, paraphrased or hinted prompt + an imperfect demonstration."""
    from grpo_zoo.testbed import task
    from grpo_zoo.variants import add_hint

    draw = rng.random()
    problem, variant, shown = question.problem, "original", 0
    if draw < cfg.warmup_hint_share and question.hint_steps:
        shown = rng.randint(1, len(question.hint_steps))
        problem, variant = add_hint(question.problem, question.hint_steps, shown), "hint"
    elif draw < cfg.warmup_hint_share + cfg.warmup_paraphrase_share and question.paraphrases:
        problem, variant = rng.choice(question.paraphrases), "paraphrase"
    target = task.demonstration(question, rng, hint_steps_shown=shown, paraphrased=variant == "paraphrase")
    prompt = Prompt(question.question_id, problem, question.answer, list(question.images), variant=variant)
    return prompt, target


def teacher_forcing_batch(policy, prompts: list[Prompt], targets: list[str]) -> RolloutBatch:
    """The targets as a RolloutBatch (one row per prompt, EOS appended), for `policy.logprobs`."""
    encoded = policy.encode(prompts)
    eos = policy.eos_token_ids[0]
    rows = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in targets]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), policy.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1.0
    return RolloutBatch(
        prompts=prompts,
        prompt_index=torch.arange(len(prompts)),
        response_ids=ids,
        response_mask=mask,
        response_texts=list(targets),
        extras={"prompt_token_ids": encoded.token_ids, "prompt_model_inputs": encoded.model_inputs},
    )


def accumulate_nll_gradient(policy, batch: RolloutBatch, micro_batch_size: int) -> float:
    """Backward the batch's mean NLL per response token, in length-sorted micro-batches; returns that mean.

    Each micro-batch adds its share (its token NLL sum / the whole batch's token count), so the
    accumulated gradient is the full batch's; sorted by length, each pads only to its own longest row.
    """
    from grpo_zoo.trainer import by_length

    total = batch.response_mask.sum()
    loss = 0.0
    for rows in by_length(batch, torch.arange(len(batch.prompts))).split(micro_batch_size):
        logp, _ = policy.logprobs(batch, rows)
        part = -(logp * batch.response_mask[rows]).sum() / total
        part.backward()
        loss += float(part.detach())
    return loss


def _lr_at(step: int, cfg: TestbedConfig) -> float:
    """warmup_lr for the first warmup_hold_share of the steps, then a cosine down to warmup_lr_min."""
    hold = int(cfg.warmup_hold_share * cfg.warmup_steps)
    if step < hold:
        return cfg.warmup_lr
    progress = (step - hold) / max(1, cfg.warmup_steps - hold - 1)
    return cfg.warmup_lr_min + 0.5 * (cfg.warmup_lr - cfg.warmup_lr_min) * (1 + math.cos(math.pi * progress))


def _build_and_train(cfg: TestbedConfig, out: Path, log: Callable[[str], None]) -> dict:
    from grpo_zoo.policy import Policy
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm
    from grpo_zoo.testbed.vision_pretrain import linear_patch_embedding, pretrain_vision

    log(f"testbed: building the tiny VLM (seed {cfg.seed}) and warming it up for {cfg.warmup_steps} steps "
        f"of {cfg.warmup_batch_size} (cached after this run)")
    # Random init + small activations produce denormal floats that make CPU kernels ~2x slower;
    # flushing them to zero changes nothing measurable (and is always on here, so results repeat).
    torch.set_flush_denormal(True)
    build_tiny_vlm(out, seed=cfg.seed)
    policy = Policy.from_pretrained(str(out))
    rng = random.Random(f"grpo_zoo.warmup:{cfg.seed}")
    start_wall, start_cpu = time.time(), time.process_time()
    # The vision tower learns first, alone, where the shapes are (testbed/vision_pretrain.py), and
    # is then frozen (warmup_vision_lr_mult = 0), as an instruct model's pretrained encoder is.
    # Trained along with the language model, it collapsed: its image tokens grew ~200x larger
    # than text embeddings while their variation across images fell from ~30% to ~2% of their
    # norm (an attention sink that shows the LM nothing), and counts were guessed from the prior.
    # The patch embedding runs as a matmul in both phases (`linear_patch_embedding`: same function, faster).
    with linear_patch_embedding(policy.model):
        vision_report = pretrain_vision(policy, steps=cfg.vision_pretrain_steps,
                                        batch_size=cfg.vision_pretrain_batch_size, lr=cfg.vision_pretrain_lr,
                                        seed=cfg.seed, log=log)
        if cfg.warmup_vision_lr_mult == 0:
            policy.freeze_vision()  # no backward through the tower either (faster)
        losses = _train_language_model(policy, cfg, rng, log, start_wall)
    policy.model.eval()
    policy.save(out)
    return {
        "settings": asdict(cfg),
        "cache_key": cache_key(cfg),
        "loss_curve": losses,
        "vision_pretrain": vision_report,
        "wall_seconds": time.time() - start_wall,
        "cpu_seconds": time.process_time() - start_cpu,
        "torch_threads": torch.get_num_threads(),
    }


def _train_language_model(policy, cfg: TestbedConfig, rng: random.Random, log: Callable[[str], None],
                          start_wall: float) -> list[float]:
    """Teacher-force the demonstrations for `warmup_steps` steps; returns the loss curve."""
    from grpo_zoo.testbed import task

    # Fresh questions from their own stream (no question is shown twice): the warm-up plays an
    # instruct model's pre-training, which never saw the RL pool, and a tiny model shown a small
    # pool for many epochs would memorise its answers instead of learning to read the image.
    questions = task.question_stream("train", cfg.seed, stream="warmup")
    vision = [p for name, p in policy.model.named_parameters() if ".visual." in f".{name}" and p.requires_grad]
    ids = {id(p) for p in vision}
    rest = [p for p in policy.parameters_for_training() if id(p) not in ids and p.requires_grad]
    groups = [{"params": rest, "lr_mult": 1.0}, {"params": vision, "lr_mult": cfg.warmup_vision_lr_mult}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.warmup_lr, weight_decay=0.0)
    policy.model.train()
    losses: list[float] = []
    every = max(1, cfg.warmup_steps // 10)
    for step in range(cfg.warmup_steps):
        pairs = [warmup_example(next(questions), rng, cfg) for _ in range(cfg.warmup_batch_size)]
        batch = teacher_forcing_batch(policy, [p for p, _ in pairs], [t for _, t in pairs])
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg) * group["lr_mult"]
        optimizer.zero_grad(set_to_none=True)
        losses.append(accumulate_nll_gradient(policy, batch, cfg.warmup_micro_batch_size))
        torch.nn.utils.clip_grad_norm_(policy.parameters_for_training(), cfg.warmup_grad_clip)
        optimizer.step()
        if (step + 1) % every == 0 or step + 1 == cfg.warmup_steps:
            recent = sum(losses[-every:]) / len(losses[-every:])
            log(f"testbed warm-up: step {step + 1}/{cfg.warmup_steps}  loss {recent:.3f}  "
                f"{time.time() - start_wall:.0f}s")
    return losses
