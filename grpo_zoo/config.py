"""The training config: one dataclass per section, every field documented with its trade-off.

A YAML recipe sets any subset of these; `grpo-zoo validate` builds the whole tree without
loading a model. Plug-in slots (estimator, selector, loss, reward functions) take a name and
that plug-in's own options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grpo_zoo.configuration import ConfigError, PluginSpec, apply_overrides, build, plugin, read_yaml
from grpo_zoo.registry import ESTIMATORS, LOSSES, REWARDS, SELECTORS


@dataclass
class LoraConfig:
    """Low-rank adapters through PEFT; off by default (tiny models train fully)."""

    enabled: bool = False
    r: int = 16  # adapter rank: more capacity, more memory
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    """The policy. `path: testbed` builds (and warms up, cached) the built-in tiny VLM."""

    path: str = "testbed"  # a local Hugging Face model directory, or `testbed`
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # bf16 pays off only for big matrices
    device: str = "auto"  # "auto" = cuda if available, else cpu
    lora: LoraConfig = field(default_factory=LoraConfig)
    gradient_checkpointing: bool = False  # trades compute for memory on long responses


@dataclass
class DataConfig:
    """Datasets in the EasyR1/verl layout (a problem with <image> tags, an answer, images)."""

    train: str = "testbed"  # parquet/jsonl/arrow file or directory, or `testbed`
    eval: str = "testbed"  # held-out set; `testbed` = the testbed's fixed held-out split
    problem_key: str = "problem"
    answer_key: str = "answer"
    image_key: str = "images"
    paraphrase_key: str = "paraphrases"  # list of strings; read by the diva selector
    hint_key: str = "hint_steps"  # list of reasoning steps; read by the diva selector
    prompt_template: str = "{problem}"  # user-turn text; {problem} is the dataset's text
    system_prompt: str = ""  # empty = the chat template's default
    max_prompt_length: int = 512  # prompts longer than this (tokens) are skipped, counted
    max_pixels: int = 12544  # images are resized into [min_pixels, max_pixels]
    min_pixels: int = 3136
    max_bad_row_share: float = 0.05  # stop when more rows than this are unreadable
    strict: bool = False  # stop at the first bad row instead of skipping it


@dataclass
class RolloutConfig:
    """How responses are sampled."""

    backend: Literal["hf", "vllm"] = "hf"  # vllm needs a GPU and the [vllm] extra
    group_size: int = 8  # G responses per prompt; group methods need G >= 2
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64  # responses are cut here (and scored as they are)


@dataclass
class RewardSpec:
    name: str = "accuracy"
    weight: float = 1.0


@dataclass
class RewardConfig:
    """Overall reward = sum of weight * function; the default is 0.9 accuracy + 0.1 format."""

    functions: list[RewardSpec] = field(
        default_factory=lambda: [RewardSpec("accuracy", 0.9), RewardSpec("format", 0.1)]
    )
    accuracy_function: str = "accuracy"  # the term reported as accuracy and fed to selectors
    reward_max: float = 1.0  # R_max; a reward outside [0, R_max] is an error
    timeout_s: float = 5.0  # per-call limit, enforced in worker processes
    num_workers: int = 1  # reward processes; 0 = score in the main process (no timeout)
    overlong_buffer: int = 0  # DAPO overlong shaping buffer L_buf in tokens; 0 = off

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if self.accuracy_function not in names:
            raise ValueError(
                f"reward.accuracy_function '{self.accuracy_function}' is not among reward.functions {names}"
            )


@dataclass
class AlgorithmConfig:
    """The three plug-ins that make an algorithm; any combination works."""

    estimator: Any = plugin(ESTIMATORS, "grpo")
    selector: Any = plugin(SELECTORS, "uniform")
    loss: Any = plugin(LOSSES, "ppo_clip")


@dataclass
class TrainConfig:
    """The optimisation loop."""

    steps: int = 100
    questions_per_step: int = 16  # B questions the selector picks per step (variants come on top)
    mini_batch_size: int = 0  # responses per optimizer step; 0 = the whole rollout batch
    micro_batch_size: int = 0  # responses per forward/backward (gradient accumulation); 0 = mini batch
    epochs_per_step: int = 1  # passes over each rollout batch (PPO epochs)
    lr: float = 1e-4
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    lr_warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    kl_coef: float = 0.0  # beta; > 0 loads a frozen reference copy of the policy
    kl_estimator: Literal["k1", "k3"] = "k3"
    seed: int = 0
    max_cpu_seconds: float = 0.0  # stop when the process has used this much CPU time; 0 = off

    def __post_init__(self) -> None:
        if self.steps < 0 or self.questions_per_step < 1:
            raise ValueError("train.steps must be >= 0 and train.questions_per_step >= 1")


@dataclass
class EvalConfig:
    """Held-out evaluation on a fixed set: sampled pass@1 (main) and greedy accuracy."""

    every: int = 20  # steps between evals; 0 = only at the start and the end
    num_questions: int = 512  # >= 500 keeps eval noise below the effects we look for
    samples: int = 4  # sampled responses per question for pass@1 (mean) and pass@k
    greedy: bool = True
    batch_size: int = 128
    at_start: bool = True


@dataclass
class OutputConfig:
    dir: str = "runs/{recipe}-{time}"  # {recipe} = config file stem, {time} = start time
    checkpoint_every: int = 50  # steps; 0 = only at the end
    keep_checkpoints: int = 2
    tensorboard: bool = True
    progress: bool = True


@dataclass
class TestbedConfig:
    """The built-in multimodal task and its tiny policy (used when path/train are `testbed`)."""

    train_questions: int = 4000  # a finite pool, revisited over epochs
    eval_questions: int = 512
    seed: int = 0
    warmup_steps: int = 600  # ~3.5 min on 2 idle threads (~0.35 s per step of 32), ~5 min on 1
    warmup_batch_size: int = 32
    warmup_lr: float = 1e-3  # 2e-3 did not learn in the feasibility probe
    warmup_lr_min: float = 1e-4  # the cosine schedule ends here
    warmup_hold_share: float = 0.5  # share of the steps held at warmup_lr before the cosine: perception
    #   (reading counts off the image) only emerges after ~250 steps at full lr
    warmup_vision_lr_mult: float = 3.0  # the vision tower's lr / warmup_lr; 1 learned no perception in 400 steps
    warmup_grad_clip: float = 1.0
    warmup_hint_share: float = 0.25  # share of warm-up prompts shown with 1..all solution steps as a hint
    warmup_paraphrase_share: float = 0.25  # share shown as a paraphrase (same difficulty as the original)
    cache_dir: str = "~/.cache/grpo_zoo/testbed"


@dataclass
class Config:
    """A whole recipe."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    testbed: TestbedConfig = field(default_factory=TestbedConfig)
    description: str = ""


def check_rewards_exist(cfg: Config) -> None:
    for i, spec in enumerate(cfg.reward.functions):
        if spec.name not in REWARDS:
            from grpo_zoo.registry import RegistryError

            try:
                REWARDS.get(spec.name)
            except RegistryError as exc:
                raise ConfigError(f"'reward.functions[{i}].name': {exc}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a recipe (or the defaults when path is None), apply overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    cfg = build(Config, data)
    check_rewards_exist(cfg)
    return cfg


__all__ = ["Config", "ConfigError", "PluginSpec", "load_config"]
