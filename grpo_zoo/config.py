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
    freeze_vision_tower: bool = False  # train only the language model (EasyR1/verl's option of the same name)
    # Run each distinct prompt through the model once and its G responses on its cached keys/values,
    # in sampling and in every log-prob pass (grpo_zoo/shared_prompts.py): the same numbers, the
    # prompt's compute paid once instead of G times. false = HF generate and a full forward per row.
    prefix_sharing: bool = True


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
class VllmConfig:
    """The vLLM engine of `rollout.backend: vllm`, colocated with training on the same GPU."""

    gpu_memory_utilization: float = 0.4  # share of GPU memory vLLM takes (weights + KV cache); the rest trains
    sleep_level: int = 1  # between rollouts: 1 = weights to CPU RAM and KV cache freed, 2 = both freed
    #   (less RAM; fine here since new weights are loaded after every update anyway), 0 = never sleep
    enforce_eager: bool = False  # skip CUDA graph capture: slower decoding, faster start, less memory
    max_model_len: int = 0  # prompt + response tokens; 0 = data.max_prompt_length + rollout.max_new_tokens
    tensor_parallel_size: int = 1  # GPUs one engine spans (weights sync in-process only with 1)
    max_images_per_prompt: int = 4  # vLLM reserves encoder memory for this many images per prompt


@dataclass
class RolloutConfig:
    """How responses are sampled."""

    backend: Literal["hf", "ray", "vllm"] = "hf"  # ray = hf policy copies in Ray actors (distributed.ray);
    #   vllm needs a GPU and the [vllm] extra
    group_size: int = 8  # G responses per prompt; group methods need G >= 2
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64  # responses are cut here (and scored as they are)
    sampling_shards: int = 0  # each rollout is split into this many contiguous blocks of prompts, each sampled
    #   from its own seed drawn from the step's RNG: the samples then depend on this number, never on how many
    #   workers run the blocks, so an hf run and a Ray run with equal shards match bit for bit on CPU.
    #   0 = one block per Ray rollout worker, and for hf one batch on the global RNG (the fastest on one CPU)
    vllm: VllmConfig = field(default_factory=VllmConfig)  # engine options, read only by backend vllm


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
class DeepSpeedConfig:
    """DeepSpeed ZeRO options, read only by `train.backend: deepspeed` (the [deepspeed] extra).

    Launch with `torchrun --nproc_per_node N -m grpo_zoo.cli train ...` (or the `deepspeed`
    launcher); a single process without a launcher also works (world size 1). Every rank runs
    the same selector; rollouts are split among ranks and gathered, and each rank trains on its
    share of every mini-batch while DeepSpeed averages the gradients.
    """

    zero_stage: int = 2  # 1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (largest models)
    offload_optimizer: bool = False  # fp32 master weights and Adam moments in CPU RAM: less GPU memory,
    #   slower steps (the optimizer runs on the CPU)
    offload_params: bool = False  # stage 3 only: parameters rest in CPU RAM between uses
    dist_backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto = nccl on GPUs, gloo on CPU
    reduce_bucket_size: int = 50_000_000  # elements per gradient reduction bucket: larger = fewer, bigger messages
    allgather_bucket_size: int = 50_000_000  # elements per parameter all-gather bucket (stages 1-2)
    overlap_comm: bool = False  # overlap gradient reduction with backward (more memory for buffers)
    contiguous_gradients: bool = True  # copy gradients into one buffer as they come: less fragmentation
    extra: dict[str, Any] = field(default_factory=dict)  # merged last into the generated DeepSpeed config
    #   (expert knobs, e.g. {"zero_optimization": {"sub_group_size": 1e9}}); batch sizes are set by grpo_zoo

    def __post_init__(self) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise ValueError(f"train.deepspeed.zero_stage must be 1, 2 or 3, got {self.zero_stage}")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(
                "train.deepspeed.offload_params needs zero_stage 3 (only stage 3 partitions parameters); "
                "set zero_stage: 3 or offload_params: false"
            )
        if self.reduce_bucket_size < 1 or self.allgather_bucket_size < 1:
            raise ValueError("train.deepspeed.reduce_bucket_size and allgather_bucket_size must be >= 1")


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
    max_cpu_seconds: float = 0.0  # stop when training steps have used this much CPU time (evals and
    #   checkpoints not counted; a resumed run continues the count); 0 = off
    backend: Literal["plain", "deepspeed"] = "plain"  # plain = one process, one device; deepspeed = ZeRO
    #   data parallel over the processes of torchrun/deepspeed (or one process), see train.deepspeed
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)  # read only by backend deepspeed

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
    by: list[str] = field(default_factory=list)  # question columns to break pass@1 and greedy accuracy down
    #   by, logged as eval/<column>=<value>/pass@1 (e.g. [tier] on the testbed: where RL gains or loses)

    def __post_init__(self) -> None:
        if len(set(self.by)) != len(self.by) or any(not c or "/" in c or "=" in c for c in self.by):
            raise ValueError(f"eval.by must be distinct column names without '/' or '=', got {self.by}")


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

    train_questions: int = 500  # the RL pool: finite, so a 120-step run revisits each question (~2x at 8 per
    #   step, ~4x at 16) and per-question state (DIVA's D, VADE's posteriors) has something to track
    eval_questions: int = 512
    seed: int = 0
    vision_pretrain_steps: int = 900  # the tower's own pre-training (testbed/vision_pretrain.py); 0 = random tower
    vision_pretrain_batch_size: int = 32  # ~1.7 min on 2 threads; 900 x 32 reads counts as well as 900 x 64
    vision_pretrain_lr: float = 1e-3  # cosine down to a tenth
    warmup_steps: int = 600  # ~4 min on 2 threads (0.39-0.41 s per step of 32, tower frozen); at 480
    #   paraphrased prompts audited harder than originals (-0.036 [-0.071, -0.001]), breaking DIVA's premise
    warmup_batch_size: int = 32
    warmup_micro_batch_size: int = 16  # forward/backward in length-sorted halves: the same gradient (a sum
    #   over rows), less padding (hinted prompts are ~1.7x as long): 330 vs 418 ms per step of 32 on 2 threads
    warmup_lr: float = 1e-3  # 2e-3 did not learn in the feasibility probe
    warmup_lr_min: float = 1e-4  # the cosine schedule ends here
    warmup_hold_share: float = 0.5  # share of the steps held at warmup_lr before the cosine
    warmup_vision_lr_mult: float = 0.0  # the vision tower's lr / warmup_lr; 0 = frozen as pre-trained
    #   (trained with the LM at 1-3x it collapsed to image-independent features, see testbed/warmup.py)
    warmup_grad_clip: float = 1.0
    warmup_hint_share: float = 0.25  # share of warm-up prompts shown with 1..all solution steps as a hint
    warmup_paraphrase_share: float = 0.5625  # share shown as a paraphrase: (1 - hint share) x 3/4, so the
    #   original wording and each of the 3 paraphrases are shown equally often (at 0.25 each paraphrase
    #   was seen a third as often as the original, and paraphrased questions audited 3 points harder)
    cache_dir: str = "~/.cache/grpo_zoo/testbed"


@dataclass
class WorkerResources:
    """What Ray reserves for one worker actor (it is placed on a node that has all of it)."""

    num_cpus: float = 1.0  # CPUs per worker; a rollout worker also runs max(1, int(num_cpus)) torch threads
    num_gpus: float = 0.0  # GPUs per worker; a fraction lets several workers share one GPU
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources, e.g. {"rollout_node": 1}


@dataclass
class RayConfig:
    """Rollout and reward workers as Ray actors (used by `rollout.backend: ray` and num_reward_workers > 0)."""

    address: str = ""  # "" = start a private local cluster; "auto" = join the running one; "ray://host:10001"
    num_rollout_workers: int = 2  # actors each holding a policy copy; prompts are split among them
    num_reward_workers: int = 0  # actors scoring in parallel, each with reward.num_workers processes; 0 = none
    rollout: WorkerResources = field(default_factory=WorkerResources)  # per rollout worker
    reward: WorkerResources = field(default_factory=WorkerResources)  # per reward worker
    num_cpus: int = 0  # a local cluster's CPUs; 0 = all cores (ignored when joining a cluster)
    object_store_mb: int = 0  # a local cluster's object store; 0 = Ray's default (30% of RAM). It holds one
    #   copy of the weights per update plus the prompts and responses in flight
    max_restarts: int = 3  # a worker that dies is restarted this many times in a run
    max_call_retries: int = 3  # a call whose worker died is re-sent (same inputs and seed) this many times

    def __post_init__(self) -> None:
        if self.num_rollout_workers < 1 or self.num_reward_workers < 0:
            raise ValueError(
                "distributed.ray.num_rollout_workers must be >= 1 and distributed.ray.num_reward_workers >= 0"
            )
        if self.max_restarts < 0 or self.max_call_retries < 0:
            raise ValueError("distributed.ray.max_restarts and max_call_retries must be >= 0")


@dataclass
class DistributedConfig:
    """Work spread over processes and nodes."""

    ray: RayConfig = field(default_factory=RayConfig)


@dataclass
class Config:
    """A whole recipe."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    testbed: TestbedConfig = field(default_factory=TestbedConfig)
    description: str = ""


def check_rewards_exist(cfg: Config) -> None:
    for i, spec in enumerate(cfg.reward.functions):
        if ":" in spec.name:
            continue  # an import path `module:function`: checked on import (run.check_config)
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
