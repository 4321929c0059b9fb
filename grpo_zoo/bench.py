"""`grpo-zoo bench`: a matrix of (recipe x seed) trials on one model, data, budget and engine, and its report.

Every trial is `grpo-zoo train RECIPE ... train.seed=S` in a process of its own (locally, or as a
Ray task with --ray), writing OUT/trials/<recipe>/seed-<S>/ (metrics.jsonl: the per-step record;
histograms.jsonl; checkpoints; train.log). A trial that ended writes trial.json with status
"done" and is never run again; one that was killed resumes from its latest checkpoint. Only
train.seed varies across seeds: testbed.seed (data, warm-up) is the same for every trial, and the
fields that make arms comparable (model, data, eval, steps, CPU budget) must resolve equal in
every arm, as ARCHITECTURE.md's condition 4 asks. Statistics and plots: grpo_zoo.bench_report.

Before the first trial, the starting base is audited once (`grpo-zoo audit` under one arm's recipe
with the bench's overrides, in a process of its own, always on this machine) into OUT/audit/; the
report heads with its figures. An existing OUT/audit/audit.json is reused, never recomputed; a
failed audit is logged (OUT/audit/audit.log), retried by the next run, and never stops the trials.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from grpo_zoo.checkpoint import latest_checkpoint
from grpo_zoo.configuration import ConfigError, build, read_yaml, to_dict

# Fields every arm must resolve to the same value: the same model, data, held-out set and budget.
SHARED_FIELDS = ("model", "data", "testbed", "eval", "train.steps", "train.max_cpu_seconds")
# Keys only the common overrides (or the seeds) may set; an arm setting them would break comparability.
ARM_FORBIDDEN = ("train.seed", "output", *SHARED_FIELDS)
COMMON_FORBIDDEN = ("train.seed", "output.dir")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.+-]+$")


class BenchError(ConfigError):
    """A benchmark cannot run as asked (missing optional dependency, changed config of finished trials)."""


@dataclass
class ArmConfig:
    """One arm: a recipe plus what only this arm changes (a bare string in YAML means just the recipe)."""

    recipe: str = ""  # YAML path: absolute, relative to the bench file, or packaged (testbed/grpo.yaml)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key -> value for this arm only


@dataclass
class BenchAuditConfig:
    """The `grpo-zoo audit` of the starting base that heads the report (OUT/audit/), run once before the trials."""

    enabled: bool = True  # false: no audit (the report says how to run one)
    questions: int = 512  # originals audited (--questions); >= 500 keeps the CIs ~ +-0.03
    variant_questions: int = 128  # questions per variant kind (--variant-questions); 0 = originals only
    kinds: list[str] | None = None  # kinds or families to audit (--kinds); null = every kind DIVA's selector builds
    durian: bool = False  # Durian's visual entropy and confidence too (one extra forward; --no-durian when false)
    recipe: str = ""  # the arm whose recipe (and arm overrides) the audit runs under; "" = the baseline

    def __post_init__(self) -> None:
        if self.questions < 1 or self.variant_questions < 0:
            raise ValueError(f"'questions' must be >= 1 and 'variant_questions' >= 0, got {self.questions} and "
                             f"{self.variant_questions}")
        if self.kinds is not None:
            from grpo_zoo.audit import KIND_NAMES
            from grpo_zoo.audit_report import INTENDED

            unknown = [k for k in self.kinds if k not in KIND_NAMES and k not in INTENDED]
            if not self.kinds or unknown:
                raise ValueError(f"'kinds' must be null (every buildable kind) or a non-empty list of kinds "
                                 f"{list(KIND_NAMES)} or families {list(INTENDED)}, got {self.kinds}")


@dataclass
class BenchConfig:
    """A head-to-head benchmark: which arms, how many seeds, the shared budget and how to report."""

    recipes: dict[str, ArmConfig] = field(default_factory=dict)  # arm name (used in tables) -> arm
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # train.seed values; >= 5 for a real claim
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key -> value for every trial (budget, eval)
    baseline: str = "grpo"  # the arm every other arm is tested against
    metric: str = "eval/pass@1"  # the main metric: sampled pass@1 on the fixed held-out set
    target: float = 0.8  # steps / CPU / wall-clock to reach this metric value are reported
    test: Literal["welch", "mann_whitney"] = "welch"  # Welch's t-test, or Mann-Whitney U for skewed results
    confidence: float = 0.95  # level of the bootstrap confidence intervals
    bootstrap_resamples: int = 9999  # more = steadier CI bounds, slower report
    output_dir: str = "runs/bench/{name}"  # {name} = bench file stem; --output-dir overrides
    parallel: int = 1  # trials at once; more than the cores slows every trial and skews CPU budgets
    threads_per_trial: int = 0  # torch threads per trial; 0 = cores // parallel
    ray: bool = False  # run trials as Ray tasks (the --ray flag sets it)
    ray_address: str = ""  # "" = start Ray on this machine; else a cluster address (shared filesystem needed)
    audit: BenchAuditConfig = field(default_factory=BenchAuditConfig)  # the starting base's audit
    description: str = ""

    def __post_init__(self) -> None:
        if not self.recipes:
            raise ValueError("'recipes' is empty: name at least one arm, e.g. recipes: {grpo: ../testbed/grpo.yaml}")
        bad = [name for name in self.recipes if not NAME_PATTERN.match(name)]
        if bad:
            raise ValueError(f"recipe name '{bad[0]}' may only use letters, digits and _ . + - (it names a folder)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"'seeds' must be a non-empty list of distinct integers, got {self.seeds}")
        if self.baseline not in self.recipes:
            raise ValueError(f"'baseline' '{self.baseline}' is not among the recipes {list(self.recipes)}")
        if not 0.0 <= self.target <= 1.0:
            raise ValueError(f"'target' must be an accuracy in [0, 1], got {self.target}")
        if not 0.0 < self.confidence < 1.0 or self.bootstrap_resamples < 100:
            raise ValueError("'confidence' must be in (0, 1) and 'bootstrap_resamples' >= 100")
        if self.parallel < 1 or self.threads_per_trial < 0:
            raise ValueError("'parallel' must be >= 1 and 'threads_per_trial' >= 0")
        check_keys(self.overrides, COMMON_FORBIDDEN, "overrides", "seeds come from 'seeds'; the output from output_dir")
        for name, arm in self.recipes.items():
            if not arm.recipe:
                raise ValueError(f"'recipes.{name}.recipe' is empty: give the recipe YAML path")
            check_keys(arm.overrides, ARM_FORBIDDEN, f"recipes.{name}.overrides", "set it in the common 'overrides'")
        if self.audit.recipe and self.audit.recipe not in self.recipes:
            raise ValueError(f"'audit.recipe' '{self.audit.recipe}' is not among the recipes {list(self.recipes)}: "
                             "name the arm whose recipe the audit runs under (empty = the baseline)")


def check_keys(overrides: dict[str, Any], forbidden: tuple[str, ...], where: str, why: str) -> None:
    for key in overrides:
        if any(key == f or key.startswith(f + ".") for f in forbidden):
            raise ValueError(f"'{where}' may not set '{key}': {why}")


def load_bench(path: str | Path) -> BenchConfig:
    """Read and validate a bench YAML (a top-level `base:` file is merged underneath, as for recipes)."""
    data = read_yaml(path)
    recipes = data.get("recipes")
    if isinstance(recipes, dict):  # `grpo: ../testbed/grpo.yaml` is short for `grpo: {recipe: ...}`
        data["recipes"] = {k: {"recipe": v} if isinstance(v, str) else v for k, v in recipes.items()}
    return build(BenchConfig, data)


def is_bench_file(path: str | Path) -> bool:
    """A bench file names its arms under `recipes:`; a recipe never has that key."""
    return "recipes" in read_yaml(path)


def validate_bench(path: str | Path, overrides: list[str] | None = None) -> str:
    """Check a bench file and every trial's recipe config without running anything; a one-line summary."""
    cfg = load_bench(path)
    trials = plan_trials(cfg, Path(path), Path(cfg.output_dir.format(name=Path(path).stem)), list(overrides or []))
    return f"bench of {len(cfg.recipes)} recipes x {len(cfg.seeds)} seeds = {len(trials)} trials vs {cfg.baseline}"


def override_strings(overrides: dict[str, Any]) -> list[str]:
    """{'train.steps': 5} -> ['train.steps=5']; values are written so that YAML reads them back unchanged."""
    import yaml

    out = []
    for key, value in overrides.items():
        text = value if isinstance(value, str) and yaml.safe_load(value) == value else json.dumps(value)
        out.append(f"{key}={text}")
    return out


# --------------------------------------------------------------------------------------
# Trials
# --------------------------------------------------------------------------------------


@dataclass
class Trial:
    """One (recipe, seed) run of `grpo-zoo train` and where it writes."""

    recipe: str
    seed: int
    recipe_path: Path
    overrides: list[str]  # key=value, last one wins: common, arm, command line, train.seed
    run_dir: Path
    fingerprint: str = ""  # hash of the resolved config (output section left out)

    @property
    def marker(self) -> Path:
        return self.run_dir / "trial.json"

    def status(self) -> str:
        """done | failed | partial (killed; resumes from its checkpoint) | new."""
        if self.marker.is_file():
            return json.loads(self.marker.read_text()).get("status", "failed")
        return "partial" if latest_checkpoint(self.run_dir) is not None else "new"

    def args(self) -> list[str]:
        """The `grpo_zoo.cli` arguments: resume when a checkpoint exists, else start in run_dir."""
        where = "--resume" if latest_checkpoint(self.run_dir) else "--output-dir"
        return ["train", str(self.recipe_path), *self.overrides, where, str(self.run_dir)]


def resolve_recipe(recipe: str, bench_path: Path) -> Path:
    """An absolute path, else a path relative to the bench file, else a packaged recipe (testbed/grpo.yaml)."""
    path = Path(recipe).expanduser()
    for candidate in ([path] if path.is_absolute() else [bench_path.parent / path]):
        if candidate.is_file():
            return candidate.resolve()
    packaged = Path(str(resources.files("grpo_zoo.configs").joinpath(recipe)))
    if not path.is_absolute() and packaged.is_file():
        return packaged
    raise ConfigError(f"recipe '{recipe}' not found next to {bench_path} nor among the packaged configs")


def plan_trials(cfg: BenchConfig, bench_path: Path, out_dir: Path, extra: list[str]) -> list[Trial]:
    """Every (recipe, seed) trial, seed-major so a half-finished bench is balanced; configs checked up front."""
    from grpo_zoo.config import load_config

    common = override_strings(cfg.overrides)
    resolved: dict[str, dict[str, Any]] = {}
    trials = []
    for seed in cfg.seeds:
        for name, arm in cfg.recipes.items():
            path = resolve_recipe(arm.recipe, bench_path)
            overrides = [*common, *override_strings(arm.overrides), *extra, f"train.seed={seed}"]
            try:
                data = to_dict(load_config(path, overrides))
            except ConfigError as exc:
                raise ConfigError(f"recipe '{name}' ({path}): {exc}") from None
            data.pop("output")
            resolved.setdefault(name, data)
            digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
            trials.append(Trial(name, seed, path, overrides, out_dir / "trials" / name / f"seed-{seed}", digest))
    check_comparable(resolved, cfg.baseline)
    return trials


def check_comparable(resolved: dict[str, dict[str, Any]], baseline: str) -> None:
    """Every arm resolves SHARED_FIELDS to the baseline's values, or the comparison would be unfair."""
    for key in SHARED_FIELDS:
        want = lookup(resolved[baseline], key)
        for name, data in resolved.items():
            got = lookup(data, key)
            if got != want:
                raise ConfigError(
                    f"arms are not comparable: '{key}' is {got!r} in '{name}' but {want!r} in '{baseline}'; "
                    f"set it in the bench file's common 'overrides' (or fix the recipe)"
                )


def lookup(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def check_fingerprints(trials: list[Trial]) -> None:
    """A finished trial run under another config would silently mix two benchmarks: refuse."""
    for trial in trials:
        if trial.status() == "done":
            stored = json.loads(trial.marker.read_text()).get("fingerprint")
            if stored and stored != trial.fingerprint:
                raise BenchError(
                    f"trial {trial.recipe} seed {trial.seed} finished under a different config ({trial.run_dir}); "
                    "use another --output-dir, or delete that trial folder to rerun it"
                )


RUNNING: set[subprocess.Popen] = set()  # trial processes started by this process, stopped on interrupt


def run_trial_process(args: list[str], env: dict[str, str], log_path: str, cwd: str) -> tuple[int, float]:
    """Run `python -m grpo_zoo.cli ARGS` to the end (also the body of the Ray task); returns (exit code, seconds)."""
    started = time.monotonic()
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "grpo_zoo.cli", *args], env={**os.environ, **env}, cwd=cwd,
                                stdout=log, stderr=subprocess.STDOUT)
        RUNNING.add(proc)
        try:
            returncode = proc.wait()
        finally:
            RUNNING.discard(proc)
    return returncode, time.monotonic() - started


def stop_running() -> None:
    """Terminate the trial processes still running (they resume from their checkpoints next time)."""
    for proc in list(RUNNING):
        proc.terminate()
    for proc in list(RUNNING):
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: SIGTERM (`kill`) raises KeyboardInterrupt, so the runner stops its child processes too."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_log_tail(log: Path, lines: int = 15) -> None:
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    print("\n".join(f"    {line}" for line in tail), flush=True)


def warm_up_once(trial: Trial) -> None:
    """Build the cached testbed warm-up before trials start, so parallel trials do not each build it."""
    from grpo_zoo.config import load_config

    if load_config(trial.recipe_path, trial.overrides).model.path != "testbed":
        return
    code = ("import sys; from grpo_zoo.config import load_config; from grpo_zoo.testbed.warmup import "
            "ensure_testbed_model; ensure_testbed_model(load_config(sys.argv[1], sys.argv[2:]).testbed)")
    if subprocess.run([sys.executable, "-c", code, str(trial.recipe_path), *trial.overrides], check=False).returncode:
        raise BenchError("building the testbed warm-up failed (see above); no trial was started")


def prepare(trial: Trial) -> None:
    if trial.run_dir.exists() and latest_checkpoint(trial.run_dir) is None:
        shutil.rmtree(trial.run_dir)  # died before its first checkpoint: start clean, no stale records
    trial.run_dir.mkdir(parents=True, exist_ok=True)
    trial.marker.unlink(missing_ok=True)


def finish(trial: Trial, args: list[str], returncode: int, seconds: float, counter: str) -> None:
    """Write the trial's marker; a failed trial runs again next time, and its log's tail is shown."""
    status = "done" if returncode == 0 else "failed"
    trial.marker.write_text(json.dumps({
        "status": status, "recipe": trial.recipe, "seed": trial.seed, "returncode": returncode,
        "wall_s": round(seconds, 3), "fingerprint": trial.fingerprint,
        "command": shlex.join(["grpo-zoo", *args]), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1))
    print(f"[{counter}] {status:<6} {trial.recipe} seed {trial.seed} in {seconds:.0f} s", flush=True)
    if status == "failed":
        print_log_tail(trial.run_dir / "train.log")


def run_trials(trials: list[Trial], parallel: int, threads: int, ray_address: str | None = None) -> int:
    """Run trials (locally with `parallel` at once, or on Ray when ray_address is not None); returns failures."""
    if ray_address is not None:
        ray_available()  # before any trial folder is touched
    env = thread_env(threads)
    for trial in trials:
        prepare(trial)
    jobs = [(t, t.args(), str(t.run_dir / "train.log")) for t in trials]
    local = ray_address is None
    runner = run_locally(jobs, env, parallel) if local else run_on_ray(jobs, env, threads, ray_address)
    failed = 0
    with sigterm_interrupts():
        for i, (trial, args, (rc, seconds)) in enumerate(runner, 1):
            finish(trial, args, rc, seconds, f"{i}/{len(trials)}")
            failed += rc != 0
    return failed


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def ray_available() -> Any:
    try:
        import ray
    except ImportError:
        raise BenchError("--ray needs Ray, an optional extra: pip install -e .[ray]") from None
    return ray


def run_locally(jobs: list, env: dict[str, str], parallel: int):
    pool = ThreadPoolExecutor(max_workers=parallel)  # threads only wait on the child processes
    cwd = os.getcwd()
    futures = {pool.submit(run_trial_process, args, env, log, cwd): (trial, args) for trial, args, log in jobs}
    try:
        for future in as_completed(futures):
            yield (*futures[future], future.result())
    finally:  # on Ctrl-C or SIGTERM: running trials stop, queued ones never start
        pool.shutdown(wait=False, cancel_futures=True)
        while not all(f.done() for f in futures):
            stop_running()
            time.sleep(0.2)


def run_on_ray(jobs: list, env: dict[str, str], threads: int, address: str):
    ray = ray_available()
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    else:  # a local Ray: trials move file paths, not data, so a small object store is plenty
        ray.init(num_cpus=os.cpu_count(), object_store_memory=100 * 2**20, include_dashboard=False,
                 ignore_reinit_error=True, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=threads, max_retries=0)(run_trial_process)
        refs = {task.remote(args, env, log, os.getcwd()): (trial, args) for trial, args, log in jobs}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            yield (*refs.pop(ready[0]), ray.get(ready[0]))
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------------------
# The starting base's audit
# --------------------------------------------------------------------------------------

AUDIT_DIR = "audit"  # OUT/audit/: audit.json, audit.md, audit.png (grpo-zoo audit), audit.log, status.json


def audit_args(cfg: BenchConfig, bench_path: Path, out_dir: Path, extra: list[str], threads: int) -> list[str]:
    """The `grpo_zoo.cli` arguments of the bench's audit: the arm's recipe under every trial's overrides.

    The arm is audit.recipe (default: the baseline); the overrides are the common ones, the arm's own
    and the command line's, in the trials' order, so the audit sees the trials' model, data and rollout.
    """
    arm = cfg.audit.recipe or cfg.baseline
    path = resolve_recipe(cfg.recipes[arm].recipe, bench_path)
    sets = [*override_strings(cfg.overrides), *override_strings(cfg.recipes[arm].overrides), *extra]
    args = ["audit", "--config", str(path)]
    for override in sets:
        args += ["--set", override]
    args += ["--out", str(out_dir / AUDIT_DIR), "--questions", str(cfg.audit.questions),
             "--variant-questions", str(cfg.audit.variant_questions)]
    if cfg.audit.kinds:
        args += ["--kinds", ",".join(cfg.audit.kinds)]
    if not cfg.audit.durian:
        args.append("--no-durian")
    return [*args, "--no-progress", "--threads", str(threads)]


def audit_key(args: list[str]) -> str:
    """Hash of what the audit measures: its arguments without --out, --threads and --no-progress."""
    kept, skip = [], False
    for arg in args:
        if skip or arg == "--no-progress":
            skip = False
        elif arg in ("--out", "--threads"):
            skip = True
        else:
            kept.append(arg)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


def audit_status(out_dir: Path) -> dict[str, Any]:
    """OUT/audit/status.json as run_audit writes it; {} when there is none (or it cannot be read)."""
    try:
        return json.loads((out_dir / AUDIT_DIR / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def run_audit(args: list[str], out_dir: Path, threads: int) -> str:
    """Audit the starting base once: reuse OUT/audit/audit.json, else run `grpo-zoo audit` into OUT/audit.

    Returns "reused", "done" or "failed". A failure is a printed warning, never an exception: the
    trials run anyway, the report says the audit failed and the next run retries it. The audit
    exits 1 when nothing parses yet still writes audit.json (whose warning the report shows): done.
    """
    audit_dir = out_dir / AUDIT_DIR
    if (audit_dir / "audit.json").is_file():
        stored = audit_status(out_dir).get("key")
        if stored and stored != audit_key(args):
            print(f"grpo-zoo bench: warning: {audit_dir / 'audit.json'} was made by another audit command (recipe, "
                  f"overrides or sizes changed); it is kept, not recomputed: delete {audit_dir} to audit again",
                  flush=True)
        else:
            print(f"audit: reusing {audit_dir / 'audit.json'}", flush=True)
        return "reused"
    audit_dir.mkdir(parents=True, exist_ok=True)
    log = audit_dir / "audit.log"
    command = shlex.join(["grpo-zoo", *args])
    print(f"audit of the starting base (log: {log}): {command}", flush=True)
    with open(log, "a") as f:
        f.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} grpo-zoo bench runs: {command}\n")
    with sigterm_interrupts():
        ((_, _, (returncode, seconds)),) = run_locally([(None, args, str(log))], thread_env(threads), 1)
    status = "done" if (audit_dir / "audit.json").is_file() else "failed"
    (audit_dir / "status.json").write_text(json.dumps({
        "status": status, "returncode": returncode, "wall_s": round(seconds, 3), "key": audit_key(args),
        "command": command, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1))
    if status == "done":
        note = "" if returncode == 0 else f" (exit code {returncode}: see the audit's warning in the report)"
        print(f"audit: done in {seconds:.0f} s{note}", flush=True)
    else:
        print(f"grpo-zoo bench: warning: the audit failed (exit code {returncode}); the trials run anyway and the "
              f"next run retries it; see {log}:", flush=True)
        print_log_tail(log)
    return status


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    out_dir: Path
    report: Path
    ran: list[Trial]  # trials started by this call
    skipped: list[Trial]  # trials already done, not rerun
    failed: int
    audit: str = ""  # the starting base's audit: reused | done | failed | "" (not run: disabled, dry run, report only)


def run_bench(path: str | Path, overrides: list[str] | None = None, output_dir: str | None = None,
              parallel: int | None = None, threads: int | None = None, ray: bool = False, address: str | None = None,
              report_only: bool = False, dry_run: bool = False) -> BenchResult:
    """Run every unfinished trial of the bench file `path`, then write OUT/report.md and OUT/summary.json."""
    from grpo_zoo.bench_report import write_report

    bench_path = Path(path)
    cfg = load_bench(bench_path)
    parallel = parallel or cfg.parallel
    threads = threads or cfg.threads_per_trial or max(1, (os.cpu_count() or 1) // parallel)
    out_dir = Path(output_dir or cfg.output_dir.format(name=bench_path.stem)).expanduser().resolve()
    extra = list(overrides or [])
    trials = plan_trials(cfg, bench_path, out_dir, extra)
    check_fingerprints(trials)
    todo = [t for t in trials if t.status() != "done"]
    skipped = [t for t in trials if t.status() == "done"]
    print(f"grpo-zoo bench: {len(cfg.recipes)} recipes x {len(cfg.seeds)} seeds in {out_dir}: "
          f"{len(skipped)} done, {len(todo)} to run ({'on Ray' if ray or cfg.ray else f'{parallel} at once'}, "
          f"{threads} torch threads each)", flush=True)
    failed = 0
    audit = ""
    to_audit = audit_args(cfg, bench_path, out_dir, extra, threads)
    if dry_run:
        if cfg.audit.enabled and not (out_dir / AUDIT_DIR / "audit.json").is_file():
            print("  [audit] " + shlex.join(["grpo-zoo", *to_audit]))
        for t in todo:
            print(f"  [{t.status()}] " + shlex.join(["grpo-zoo", *t.args()]))
        todo = []
    elif not report_only:
        if cfg.audit.enabled:  # before the trials: it also builds the testbed warm-up they share
            audit = run_audit(to_audit, out_dir, threads)
        if todo:
            use_ray = ray or cfg.ray
            if parallel > 1 or use_ray:
                warm_up_once(todo[0])
            failed = run_trials(todo, parallel, threads, (address or cfg.ray_address) if use_ray else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = write_report(out_dir, cfg, trials, extra, audit_command=to_audit)
    print(f"report: {report}")
    return BenchResult(out_dir, report, [] if report_only else todo, skipped, failed, audit)
