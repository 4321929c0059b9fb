"""Score responses with weighted reward functions, every call time-limited in worker processes.

Step 3 of the training step. overall_i = sum_f weight_f * value_f(response_i, answer_i), where
each function returns a finite value in [0, 1], so overall_i lies in [0, sum of weights] and the
weights may sum to at most R_max (reward.reward_max). Contract for a function's value:
- raises, hangs past timeout_s, or kills its worker: the value is 0 for that response, and the
  event is counted (RewardResult.errors / .timeouts, per function in metrics) and logged;
- NaN, inf, a non-number, or a value outside [0, 1] (beyond 1e-6 of float noise): a bug in
  the function, so score() raises ValueError naming it (after the batch finishes, so the
  worker pool stays usable).

Why processes and not threads: math-verify's own timeout uses signal.alarm, which fails
outside the main thread, and some LaTeX keeps sympy busy for minutes; a thread cannot be
stopped, a process can be killed. Workers are started with 'spawn' (a fresh interpreter that
inherits sys.path), and find each function by its import path `module:qualname` or, failing
that, by its registry name, so registry names, entry points and module-level functions of
tests all work. num_workers=0 scores in the calling process without a time limit (debugging).
As with any 'spawn' pool, a script that scores with workers needs `if __name__ == "__main__":`.
"""

from __future__ import annotations

import importlib
import logging
import math
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from grpo_zoo.registry import REWARDS

if TYPE_CHECKING:  # torch is imported lazily so that worker processes start in a fraction of a second
    import torch

    from grpo_zoo.config import RewardConfig

log = logging.getLogger(__name__)

_TOLERANCE = 1e-6  # float noise tolerated outside [0, 1] (then clamped), e.g. a sum of fractions
_MAX_LOGGED = 3  # failures logged one by one per function and batch; the rest only counted
_MAX_CHUNK = 64  # calls sent to a worker at once; small enough to balance, large enough to batch IPC

RewardFn = Callable[..., float]


@dataclass
class RewardResult:
    """Rewards of one batch of N responses."""

    overall: torch.Tensor  # [N] float32, sum_f weight_f * value_f, in [0, R_max]
    per_function: dict[str, torch.Tensor]  # name -> [N] float32, unweighted values in [0, 1]
    accuracy: torch.Tensor  # [N] float32, per_function[accuracy_function]
    metrics: dict[str, float]  # means, std, failure counts and time; keys listed in RewardRunner.score
    timeouts: int = 0  # calls stopped at the time limit (scored 0), all functions
    errors: int = 0  # calls that raised or crashed their worker (scored 0), all functions


def resolve_reward(name: str) -> RewardFn:
    """The reward function for a registry name ("accuracy") or an import path ("pkg.mod:fn").

    Unknown registry names raise RegistryError listing the known ones.
    """
    if ":" in name:
        module_name, _, qualname = name.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"reward function '{name}' cannot be imported: {exc}") from None
    else:
        obj = REWARDS.get(name).obj
    if not callable(obj):
        raise ValueError(f"reward function '{name}' is {type(obj).__name__}, not a callable")
    return obj


def _import_path(fn: Any) -> str | None:
    """`module:qualname` under which a worker process can import `fn`, if it has one."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        return None
    return f"{module}:{qualname}"


def _call(fn: RewardFn, response: str, answer: str, context: dict[str, Any]) -> tuple[str, Any]:
    """Run one reward call: ("ok", float) | ("error", message) | ("invalid", repr of a non-number)."""
    try:
        value = fn(response, answer, **context)
    except (Exception, SystemExit) as exc:  # a user function's bug (even exit()) costs one reward, not the run
        return "error", f"{type(exc).__name__}: {exc}"[:500]
    if isinstance(value, (str, bytes)):  # float("1") would pass: a string is a bug, not a score
        return "invalid", repr(value)[:200]
    try:
        return "ok", float(value)
    except Exception:  # TypeError, ValueError, OverflowError (an int beyond float), a broken __float__
        return "invalid", _safe_repr(value)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)[:200]
    except Exception:
        return f"<{type(value).__name__} without a repr>"


def _worker_main(conn: Connection, refs: list[tuple[str, str | None]]) -> None:
    """Worker process loop: resolve the functions, say ready, then answer one message per call."""
    try:
        fns = []
        for name, path in refs:
            try:
                fns.append(resolve_reward(path) if path else resolve_reward(name))
            except Exception:
                fns.append(resolve_reward(name))  # e.g. registered from an entry point only
        for fn in fns:
            warmup = getattr(fn, "warmup", None)
            if callable(warmup):
                warmup()  # imports (math-verify, sympy) must not count against the first call's limit
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        if batch is None:
            return
        for f, response, answer, context in batch:
            conn.send(_call(fns[f], response, answer, context))


class _Worker:
    """One reward process and the calls sent to it, oldest first."""

    def __init__(self, ctx: Any, refs: list[tuple[str, str | None]]):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, refs), daemon=True, name="grpo-zoo-reward")
        self.process.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.inflight: deque[int] = deque()  # job indices; the first is running now
        self.deadline = math.inf  # when the running call exceeds its time limit

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


@dataclass
class _Batch:
    """Values and failure counts of one score() call, filled in as results arrive."""

    names: list[str]
    values: list[list[float]]  # [F][N]
    timeouts: list[int] = field(default_factory=list)  # [F]
    errors: list[int] = field(default_factory=list)  # [F]
    invalid: list[str] = field(default_factory=list)  # messages for the ValueError raised at the end

    def record(self, f: int, i: int, status: str, payload: Any) -> None:
        name = self.names[f]
        if status == "ok":
            value = payload
            if not math.isfinite(value) or value < -_TOLERANCE or value > 1.0 + _TOLERANCE:
                self.invalid.append(f"reward function '{name}' returned {value!r} for response {i}")
                value = 0.0
            self.values[f][i] = min(max(value, 0.0), 1.0)
            return
        self.values[f][i] = 0.0
        if status == "invalid":
            self.invalid.append(f"reward function '{name}' returned a non-number {payload} for response {i}")
            return
        counts = self.timeouts if status == "timeout" else self.errors
        counts[f] += 1
        if counts[f] <= _MAX_LOGGED:
            what = "timed out" if status == "timeout" else "failed"
            log.warning("reward function '%s' %s on response %d; scored 0: %s", name, what, i, payload)


class RewardRunner:
    """Weighted reward functions over a pool of worker processes, each call time-limited.

    specs: (name, weight) pairs; a name is a registry name or `module:qualname`. Weights are
    >= 0 (0 computes and logs a function without rewarding it) and sum to at most reward_max.
    accuracy_function: the spec whose values are reported as accuracy (and fed to selectors).
    timeout_s: per-call limit. num_workers: processes (0 = inline, no limit).
    startup_timeout_s: how long a worker may take to start (imports) before it is an error.
    Use as a context manager, or call close(), to stop the workers.
    """

    def __init__(
        self,
        specs: Sequence[tuple[str, float]],
        accuracy_function: str = "accuracy",
        reward_max: float = 1.0,
        timeout_s: float = 5.0,
        num_workers: int = 1,
        startup_timeout_s: float = 120.0,
    ):
        _check_settings(specs, accuracy_function, reward_max, timeout_s, num_workers)
        self.names = [name for name, _ in specs]
        self.weights = [float(weight) for _, weight in specs]
        self.accuracy_function = accuracy_function
        self.reward_max = float(reward_max)
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers)
        self.startup_timeout_s = float(startup_timeout_s)
        self._fns = [resolve_reward(name) for name in self.names]  # fail fast in the caller's process
        self._refs = [(name, _import_path(fn)) for name, fn in zip(self.names, self._fns)]
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []

    @classmethod
    def from_config(cls, cfg: RewardConfig) -> RewardRunner:
        """Build from the recipe's `reward` section."""
        specs = [(spec.name, spec.weight) for spec in cfg.functions]
        return cls(specs, cfg.accuracy_function, cfg.reward_max, cfg.timeout_s, cfg.num_workers)

    def score(
        self, responses: Sequence[str], answers: Sequence[str], contexts: Sequence[dict[str, Any]] | None = None
    ) -> RewardResult:
        """Reward N responses against their gold answers; contexts[i] is passed as **context.

        metrics keys: reward_mean, reward_std (population), accuracy_mean, reward_<name>_mean,
        reward_<name>_timeouts, reward_<name>_errors, reward_timeouts, reward_errors,
        reward_seconds. An empty batch gives empty tensors and zero metrics.
        Raises ValueError on mismatched lengths and on invalid values (see the module docstring).
        """
        n = len(responses)
        if len(answers) != n or (contexts is not None and len(contexts) != n):
            got = f"{n} responses, {len(answers)} answers" + ("" if contexts is None else f", {len(contexts)} contexts")
            raise ValueError(f"RewardRunner.score needs one answer (and context) per response; got {got}")
        ctxs = [dict(c) for c in contexts] if contexts is not None else [{} for _ in range(n)]
        started = time.monotonic()
        num_fns = len(self.names)
        batch = _Batch(self.names, [[0.0] * n for _ in range(num_fns)], [0] * num_fns, [0] * num_fns)
        jobs = [(f, i) for i in range(n) for f in range(num_fns)]
        if self.num_workers == 0:
            for f, i in jobs:
                batch.record(f, i, *_call(self._fns[f], responses[i], answers[i], ctxs[i]))
        elif jobs:
            self._run_pool(batch, jobs, responses, answers, ctxs)
        for f, name in enumerate(self.names):
            failed = batch.errors[f] + batch.timeouts[f]
            if failed > _MAX_LOGGED:
                log.warning("reward function '%s': %d errors and %d timeouts in a batch of %d (scored 0)",
                            name, batch.errors[f], batch.timeouts[f], n)
        if batch.invalid:
            more = f" (and {len(batch.invalid) - 1} more)" if len(batch.invalid) > 1 else ""
            raise ValueError(f"{batch.invalid[0]}{more}; a reward function must return a finite number in [0, 1]")
        return self._result(batch, time.monotonic() - started)

    def _result(self, batch: _Batch, seconds: float) -> RewardResult:
        import torch

        n = len(batch.values[0])
        overall = [
            min(max(sum(w * values[i] for w, values in zip(self.weights, batch.values)), 0.0), self.reward_max)
            for i in range(n)
        ]
        per_function = {name: torch.tensor(v, dtype=torch.float32) for name, v in zip(self.names, batch.values)}
        overall_t = torch.tensor(overall, dtype=torch.float32)  # [N]
        accuracy = per_function[self.accuracy_function]  # [N]

        def mean(t: torch.Tensor) -> float:
            return float(t.mean()) if n else 0.0

        metrics = {
            "reward_mean": mean(overall_t),
            "reward_std": float(overall_t.std(unbiased=False)) if n else 0.0,
            "accuracy_mean": mean(accuracy),
            "reward_timeouts": float(sum(batch.timeouts)),
            "reward_errors": float(sum(batch.errors)),
            "reward_seconds": seconds,
        }
        for f, name in enumerate(self.names):
            metrics[f"reward_{name}_mean"] = mean(per_function[name])
            metrics[f"reward_{name}_timeouts"] = float(batch.timeouts[f])
            metrics[f"reward_{name}_errors"] = float(batch.errors[f])
        return RewardResult(overall_t, per_function, accuracy, metrics, sum(batch.timeouts), sum(batch.errors))

    # ---- the worker pool -------------------------------------------------------------------

    def _run_pool(self, batch: _Batch, jobs: list[tuple[int, int]], responses: Sequence[str],
                  answers: Sequence[str], contexts: list[dict[str, Any]]) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self._refs))
        pending = deque(range(len(jobs)))
        chunk = max(1, min(_MAX_CHUNK, math.ceil(len(jobs) / (4 * self.num_workers))))
        try:
            while pending or any(w.inflight for w in self._workers):
                for k, w in enumerate(self._workers):
                    if w.ready and not w.inflight and pending and not w.process.is_alive():
                        w.kill()  # died while idle (killed from outside): restart it, charging no call
                        self._workers[k] = _Worker(self._ctx, self._refs)
                        continue
                    if w.ready and not w.inflight and pending:
                        ids = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                        calls = [(jobs[j][0], responses[jobs[j][1]], answers[jobs[j][1]], contexts[jobs[j][1]])
                                 for j in ids]
                        try:
                            w.conn.send(calls)
                        except OSError:  # it died while idle: nothing of this batch is lost
                            pending.extendleft(reversed(ids))
                            self._replace(k, batch, jobs, pending, "error", "worker process died")
                            continue
                        w.inflight.extend(ids)
                        w.deadline = time.monotonic() + self.timeout_s
                self._collect(batch, jobs, pending)
        except BaseException:
            # A worker still holding calls would answer them during the next batch, and one that
            # failed to start is dead: drop both (the next batch starts replacements).
            for w in [w for w in self._workers if w.inflight or not w.ready]:
                w.kill()
                self._workers.remove(w)
            raise

    def _collect(self, batch: _Batch, jobs: list[tuple[int, int]], pending: deque[int]) -> None:
        """Wait for results or the nearest deadline; record results, stop hung or dead workers."""
        deadlines = [w.deadline if w.ready else w.started + self.startup_timeout_s for w in self._workers]
        nearest = min(deadlines)
        timeout = None if math.isinf(nearest) else max(0.0, nearest - time.monotonic())
        readable = wait([w.conn for w in self._workers], timeout)
        for k in range(len(self._workers)):
            w = self._workers[k]
            if w.conn in readable and not self._receive(w, batch, jobs):
                self._replace(k, batch, jobs, pending, "error", f"worker process died (exit code {w.process.exitcode})")
        now = time.monotonic()
        for k in range(len(self._workers)):
            w = self._workers[k]
            if w.ready and w.inflight and now >= w.deadline:
                self._replace(k, batch, jobs, pending, "timeout", f"no result after {self.timeout_s:g} s")
            elif not w.ready and now >= w.started + self.startup_timeout_s:
                raise RuntimeError(f"a reward worker did not start within {self.startup_timeout_s:g} s")

    def _receive(self, w: _Worker, batch: _Batch, jobs: list[tuple[int, int]]) -> bool:
        """Read every message waiting on a worker's pipe; False if the worker has died."""
        try:
            while w.conn.poll():
                status, payload = w.conn.recv()
                if status == "ready":
                    w.ready = True
                    w.deadline = time.monotonic() + self.timeout_s if w.inflight else math.inf
                    continue
                if status == "failed":
                    raise ValueError(
                        f"a reward worker process could not load the reward functions {self.names}: {payload}. "
                        "Reward functions must be importable by name (registry or entry point) or module:qualname"
                    )
                f, i = jobs[w.inflight.popleft()]
                batch.record(f, i, status, payload)
                w.deadline = time.monotonic() + self.timeout_s if w.inflight else math.inf
        except (EOFError, OSError):
            w.process.join(timeout=1)
            return False
        return True

    def _replace(self, k: int, batch: _Batch, jobs: list[tuple[int, int]], pending: deque[int],
                 status: str, reason: str) -> None:
        """Kill worker k, score its running call 0 (counted as `status`), requeue the rest, restart it."""
        w = self._workers[k]
        w.kill()
        if not w.ready:
            raise RuntimeError(f"a reward worker exited while starting (exit code {w.process.exitcode})")
        if w.inflight:
            f, i = jobs[w.inflight.popleft()]
            batch.record(f, i, status, reason)
            pending.extendleft(reversed(w.inflight))
            w.inflight.clear()
        self._workers[k] = _Worker(self._ctx, self._refs)

    def close(self) -> None:
        """Stop the worker processes (idempotent); a later score() starts new ones."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.process.join(timeout=2)
            w.kill()
        self._workers = []

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_reward_settings(specs: Sequence[tuple[str, float]], accuracy_function: str = "accuracy",
                          reward_max: float = 1.0, timeout_s: float = 5.0, num_workers: int = 1) -> None:
    """What RewardRunner checks at construction, for a config check before any model loads.

    Raises ValueError naming the recipe field (weights, R_max, time limit, workers), or the
    function that cannot be imported or is unknown to the registry.
    """
    from grpo_zoo.registry import RegistryError

    _check_settings(specs, accuracy_function, reward_max, timeout_s, num_workers)
    for name, _ in specs:
        try:
            resolve_reward(name)
        except RegistryError as exc:
            raise ValueError(f"reward.functions: {exc}") from None


def _check_settings(specs: Sequence[tuple[str, float]], accuracy_function: str, reward_max: float,
                    timeout_s: float, num_workers: int) -> None:
    """Config errors, each naming the recipe field to change."""
    names = [name for name, _ in specs]
    if not names:
        raise ValueError("reward.functions is empty: list at least one reward function, e.g. accuracy")
    if len(set(names)) != len(names):
        raise ValueError(f"reward.functions lists a function twice: {names}; merge the weights")
    if accuracy_function not in names:
        raise ValueError(f"reward.accuracy_function '{accuracy_function}' is not among reward.functions {names}")
    if not (math.isfinite(reward_max) and reward_max > 0):
        raise ValueError(f"reward.reward_max must be a positive number, got {reward_max}")
    for name, weight in specs:
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"reward.functions '{name}' has weight {weight}; weights must be finite and >= 0")
    total = sum(weight for _, weight in specs)
    if total > reward_max + _TOLERANCE:
        raise ValueError(
            f"reward.functions weights sum to {total:g} > reward.reward_max {reward_max:g}: each function returns "
            "a value in [0, 1], so lower the weights or raise reward_max"
        )
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"reward.timeout_s must be a positive number of seconds, got {timeout_s}")
    if num_workers < 0:
        raise ValueError(f"reward.num_workers must be >= 0 (0 = score inline), got {num_workers}")


__all__ = ["RewardResult", "RewardRunner", "check_reward_settings", "resolve_reward"]
