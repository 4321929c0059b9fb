"""Settings of `grpo-zoo augment`: the teacher, its prompts, the quality gates and the run.

DIVA-GRPO (arXiv 2603.01106) builds its "same" variants from paraphrases and its "easier"
variants from reasoning steps shown as hints; both are written offline into dataset columns
(DataConfig.paraphrase_key / hint_key) that the `diva` selector reads. These dataclasses hold
every knob of that offline pass; the CLI fills them from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_zoo.config import DataConfig

PARTS = ("paraphrases", "hints")


@dataclass
class TeacherConfig:
    """Which model writes the material and how it is sampled."""

    source: str = ""  # a local Hugging Face model directory, or an http(s) URL of an OpenAI-compatible API
    model: str = ""  # endpoint only: the served model name; "" = the first one GET /models lists
    api_key_env: str = "OPENAI_API_KEY"  # endpoint only: environment variable holding the bearer token, if set
    vision: bool = True  # endpoint only: send images (the server must serve a vision-language model)
    temperature: float = 0.7  # 0 = greedy; some diversity helps paraphrases differ from each other
    top_p: float = 1.0
    max_new_tokens: int = 1024  # the solve prompt needs room for the steps and the boxed answer
    system_prompt: str = ""  # "" = none (the chat template's default)
    # Local model only.
    device: str = "auto"  # "auto" = cuda when available, else cpu
    dtype: str = "float32"  # bfloat16 halves memory on a GPU
    batch_size: int = 8  # prompts per generate call (a row makes two prompts: paraphrase and solve)
    # Endpoint only: concurrency and fault handling.
    workers: int = 8  # requests in flight; a vLLM server batches them
    timeout_s: float = 120.0  # per request; a slow long answer is cut here and retried
    max_retries: int = 3  # retries after a timeout, a connection error, HTTP 408/429/5xx or an unreadable body
    backoff_s: float = 1.0  # first retry waits this long, doubling each time (with jitter)
    max_backoff_s: float = 30.0  # cap on one wait, including a server's Retry-After

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"teacher temperature must be >= 0 and top_p in (0, 1], got {self.temperature}, "
                             f"{self.top_p}")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.workers < 1:
            raise ValueError("teacher max_new_tokens, batch_size and workers must be >= 1")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("teacher timeout_s must be > 0 and max_retries, backoff_s, max_backoff_s >= 0")

    @property
    def is_endpoint(self) -> bool:
        return self.source.startswith(("http://", "https://"))


@dataclass
class AugmentConfig:
    """One augmentation pass over a dataset file."""

    input: str = ""  # a .jsonl, .json or .parquet file in the EasyR1/verl layout
    output: str = ""  # same format as the input; may equal it (written atomically)
    data: DataConfig = field(default_factory=DataConfig)  # column names (problem_key, answer_key, ...)
    difficulty_key: str = "difficulty"  # DIVA's D_q column, filled with initial_difficulty where absent
    initial_difficulty: float = 5.0  # DIVA starts every question at D = 5 on its [1, 9] scale
    parts: tuple[str, ...] = PARTS  # what to write: "paraphrases", "hints", or both
    num_paraphrases: int = 3  # asked of the teacher; fewer are kept when some fail the gates
    min_hint_steps: int = 1  # fewer usable steps than this rejects the row's hints
    paraphrase_template: str = ""  # path of a template file; "" = the packaged templates/paraphrase.txt
    solve_template: str = ""  # path of a template file; "" = the packaged templates/solve.txt
    image_marker: str = "[image]"  # stands for `<image>` in teacher prompts (a local VLM turns `<image>` into pixels)
    verifier: str = "accuracy"  # reward function that checks the teacher's \boxed{} answer (math-verify)
    verify_timeout_s: float = 5.0  # per answer, enforced in a worker process
    verify_workers: int = 1  # verification processes; 0 = in this process, no time limit (tests, debugging)
    chunk_rows: int = 0  # rows sent to the teacher between journal writes; 0 = 4 x batch_size or workers
    limit: int = 0  # augment at most this many rows (every row is still written); 0 = all
    progress: bool = True  # tqdm progress bar on stderr
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def __post_init__(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise ValueError(f"augment parts must be a non-empty subset of {PARTS}, got {list(self.parts)}")
        if self.num_paraphrases < 1 or self.min_hint_steps < 1:
            raise ValueError("augment num_paraphrases and min_hint_steps must be >= 1")
        if not 1.0 <= self.initial_difficulty <= 9.0:
            raise ValueError(f"augment initial_difficulty must be in [1, 9] (DIVA's scale), got "
                             f"{self.initial_difficulty}")
        if not self.image_marker.strip() or self.image_marker == "<image>":
            raise ValueError("augment image_marker must be non-empty text other than '<image>', e.g. '[image]'")
        if self.chunk_rows < 0 or self.limit < 0 or self.verify_workers < 0 or self.verify_timeout_s <= 0:
            raise ValueError("augment chunk_rows, limit and verify_workers must be >= 0 and verify_timeout_s > 0")
