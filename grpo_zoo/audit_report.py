"""Statistics, verdicts and reports of `grpo-zoo audit` (the sampling lives in grpo_zoo.audit).

Per question q the audit has c_q correct responses out of G; sampled pass@1 of q is c_q / G,
and a set's sampled pass@1 is the mean over its questions (the main metric of the eval).

Verdict rule for a variant kind (documented in `grpo-zoo audit --help` too):
    d_q = pass@1(variant of q) - pass@1(q), over the questions audited both ways.
    A paired percentile bootstrap of mean(d) (questions resampled with replacement, seeded,
    the same resample for both sides) gives a CI at `level` (95% by default).
    CI entirely above 0 -> "easier"; entirely below 0 -> "harder"; otherwise "same".
    The verdict is "inverted" when that direction contradicts the kind's intent in DIVA-GRPO
    (arXiv 2603.01106): a hint is meant to be easier, a perturbation or only-vision harder,
    a paraphrase the same. So a hint found "harder", a perturbation found "easier" or a
    paraphrase found easier or harder is "inverted"; a hint or perturbation found "same" stays
    "same" (it does not do its job; the findings warn about it).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_zoo.evaluation import pass_at_k

INTENDED = {"hint": "easier", "paraphrase": "same", "perturb": "harder", "only_vision": "harder"}
"""Direction each DIVA variant family is meant to move a question's accuracy."""

ALPHA = 0.05  # significance level for "accuracy falls with the Durian signal"
MANY = 0.15  # a share of all-wrong / all-right groups this large shapes the method choice (ARCHITECTURE.md)
FEW = 0.05  # below this share a group kind hardly matters
FEW_VISITS = 2.0  # fewer visits per question than this leave per-question state (D, posteriors) near its prior


def bootstrap_mean_ci(values: np.ndarray, resamples: int, level: float, seed: int) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap CI of the mean of `values` [Q], seeded.

    One value gives a zero-width interval (there is no spread to resample).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_mean_ci: no values (an audited set needs at least one question)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(resamples, values.size))  # [R, Q]
    means = values[idx].mean(axis=1)  # [R]
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(values.mean()), float(lo), float(hi)


def paired_difference(variant: np.ndarray, original: np.ndarray, resamples: int, level: float,
                      seed: int) -> tuple[float, float, float]:
    """(mean d, lo, hi) for d_q = variant_q - original_q [Q]: the paired bootstrap of the verdict rule."""
    variant, original = np.asarray(variant, dtype=np.float64), np.asarray(original, dtype=np.float64)
    if variant.shape != original.shape:
        raise ValueError(f"paired_difference: {variant.shape} variant vs {original.shape} original accuracies; "
                         "both must hold the same questions")
    return bootstrap_mean_ci(variant - original, resamples, level, seed)


def direction_of(lo: float, hi: float) -> str:
    """"easier" if the CI of the difference lies above 0, "harder" if below, else "same"."""
    if lo > 0:
        return "easier"
    if hi < 0:
        return "harder"
    return "same"


def verdict(direction: str, intended: str) -> str:
    """The direction, or "inverted" when it contradicts the intended one (module docstring)."""
    if intended == "same":
        return "same" if direction == "same" else "inverted"
    opposite = {"easier": "harder", "harder": "easier"}[intended]
    return "inverted" if direction == opposite else direction


@dataclass
class GroupStats:
    """Group-level figures of one audited set (originals or one variant kind) at group size G."""

    questions: int
    group_size: int
    histogram: list[int]  # [G + 1] questions with 0..G correct responses
    share_all_wrong: float  # c = 0: zero advantage under GRPO, nothing to sharpen
    share_all_right: float  # c = G: zero advantage too
    share_mixed: float
    sampled_pass1: float  # mean of c / G
    sampled_pass1_ci: tuple[float, float]
    pass_at_k: dict[str, float]  # "pass@k" -> unbiased pass@k (Chen et al. 2021), k = 1, 2, 4, ..., G
    greedy_pass1: float | None  # one greedy response per question; None when not sampled
    parse_rate: float  # share of sampled responses with a final answer the reward can read


def group_stats(successes: np.ndarray, group_size: int, *, greedy: np.ndarray | None = None,
                parse_rate: float = 1.0, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> GroupStats:
    """GroupStats from per-question correct counts c_q in 0..G (successes [Q] int), greedy [Q] 0/1."""
    c = np.asarray(successes, dtype=np.int64)
    if c.size == 0 or c.min() < 0 or c.max() > group_size:
        raise ValueError(f"group_stats: successes must be a non-empty list of counts in 0..{group_size}")
    mean, lo, hi = bootstrap_mean_ci(c / group_size, resamples, level, seed)
    ks = sorted({k for k in (2 ** i for i in range(group_size.bit_length())) if k <= group_size} | {group_size})
    return GroupStats(
        questions=int(c.size),
        group_size=group_size,
        histogram=np.bincount(c, minlength=group_size + 1).tolist(),
        share_all_wrong=float((c == 0).mean()),
        share_all_right=float((c == group_size).mean()),
        share_mixed=float(((c > 0) & (c < group_size)).mean()),
        sampled_pass1=mean,
        sampled_pass1_ci=(lo, hi),
        pass_at_k={f"pass@{k}": float(np.mean([pass_at_k(group_size, int(n), k) for n in c])) for k in ks},
        greedy_pass1=None if greedy is None else float(np.mean(greedy)),
        parse_rate=float(parse_rate),
    )


@dataclass
class KindResult:
    """One variant kind against the originals on the same questions."""

    kind: str  # e.g. "hint_1", "perturb_noise"
    family: str  # the DIVA kind it is built as: hint | paraphrase | perturb | only_vision
    intended: str
    stats: GroupStats
    original_pass1: float  # the originals' sampled pass@1 on these questions
    difference: float  # variant - original, mean over questions
    difference_ci: tuple[float, float]
    direction: str  # easier | same | harder
    verdict: str  # the direction, or "inverted"
    question_ids: list[int]
    successes: list[int]  # c_q of the variant, [Q]
    original_successes: list[int]  # c_q of the original, [Q]
    rescued: float | None = None  # of the questions all wrong as originals, the share with >= 1 right here


def rescued_share(variant: np.ndarray, original: np.ndarray) -> float | None:
    """Share of originally all-wrong questions (c = 0) with at least one right variant response.

    What DIVA's hints are for: an all-wrong group gives GRPO nothing, a mixed one does. None
    when no question was all wrong.
    """
    was_wrong = np.asarray(original) == 0
    return float((np.asarray(variant)[was_wrong] > 0).mean()) if was_wrong.any() else None


def compare_kind(kind: str, family: str, variant: np.ndarray, original: np.ndarray, group_size: int, *,
                 question_ids: list[int], greedy: np.ndarray | None = None, parse_rate: float = 1.0,
                 resamples: int = 2000, level: float = 0.95, seed: int = 0) -> KindResult:
    """Figures, paired difference and verdict of one kind; variant/original are c_q [Q] on the same questions."""
    variant, original = np.asarray(variant, dtype=np.int64), np.asarray(original, dtype=np.int64)
    stats = group_stats(variant, group_size, greedy=greedy, parse_rate=parse_rate, resamples=resamples,
                        level=level, seed=seed)
    diff, lo, hi = paired_difference(variant / group_size, original / group_size, resamples, level, seed)
    direction = direction_of(lo, hi)
    return KindResult(kind, family, INTENDED[family], stats, float((original / group_size).mean()), diff, (lo, hi),
                      direction, verdict(direction, INTENDED[family]), list(question_ids), variant.tolist(),
                      original.tolist(), rescued_share(variant, original))


# ---------------------------------------------------------------------------------------
# Durian's difficulty signals and revisits
# ---------------------------------------------------------------------------------------


def _spearman(signal: np.ndarray, accuracy: np.ndarray) -> tuple[float | None, float | None]:
    from scipy.stats import spearmanr

    if signal.size < 3 or np.ptp(signal) == 0 or np.ptp(accuracy) == 0:
        return None, None  # no spread on one side: no rank correlation to speak of
    rho, p = spearmanr(signal, accuracy)
    return float(rho), float(p)


def _signal_report(difficulty: np.ndarray, accuracy: np.ndarray, groups: np.ndarray,
                   names: list[str]) -> dict[str, Any]:
    rho, p = _spearman(difficulty, accuracy)
    rows = [{"group": name, "questions": int((groups == g).sum()),
             "accuracy": float(accuracy[groups == g].mean()) if (groups == g).any() else None}
            for g, name in enumerate(names)]
    return {"available": True, "groups": rows, "spearman_rho": rho, "p_value": p,
            "accuracy_falls": bool(rho is not None and rho < 0 and p is not None and p < ALPHA)}


def durian_signals(accuracy: np.ndarray, entropy: np.ndarray | None, confidence: np.ndarray | None,
                   bins: int = 12, missing: str = "") -> dict[str, Any]:
    """Durian's perceptual and reasoning difficulty (arXiv 2602.21743) against per-question accuracy.

    accuracy [Q] (c_q / G); entropy [Q] the spectral entropy H of each question's first image;
    confidence [Q] the mean summed log-prob of its G responses. Groups are made by Durian's own
    grouping functions over the audited set (training groups within a batch): H quartiles
    (<= q25, middle, >= q75) and b equal-frequency confidence bins (bin 0 = least confident).
    "accuracy_falls" is True when the Spearman rank correlation of accuracy with the difficulty
    direction (H, and -confidence) is negative at p < 0.05. `missing` says why entropy is None.
    """
    from grpo_zoo.algorithms.advantages import LocalGroups
    from grpo_zoo.algorithms.durian import DurianConfig, perceptual_groups, reasoning_groups
    from grpo_zoo.types import AdvantageInputs

    acc = np.asarray(accuracy, dtype=np.float64)
    q = acc.size
    ids = torch.arange(q)
    inputs = AdvantageInputs(
        rewards=torch.as_tensor(acc), prompt_ids=ids, question_ids=ids, response_mask=torch.ones(q, 1),
        seq_logprob=None if confidence is None else torch.as_tensor(np.asarray(confidence, dtype=np.float64)),
        visual_entropy=None if entropy is None else torch.as_tensor(np.asarray(entropy, dtype=np.float64)),
    )
    lg = LocalGroups.of(inputs)
    out: dict[str, Any] = {"visual_entropy": {"available": False, "reason": missing or "not computed"},
                           "confidence": {"available": False, "reason": "not computed"}}
    if entropy is not None:
        groups, quartiles = perceptual_groups(inputs, lg)
        h = np.asarray(entropy, dtype=np.float64)
        out["visual_entropy"] = _signal_report(h, acc, groups.numpy(), ["low (H <= q25)", "middle", "high (H >= q75)"])
        out["visual_entropy"].update({k: float(v) for k, v in quartiles.items()})
    if confidence is not None:
        b = max(1, min(bins, q // 8))  # at least ~8 questions per bin, or the bin means are noise
        groups, b = reasoning_groups(inputs, lg, DurianConfig(bins=b))
        conf = np.asarray(confidence, dtype=np.float64)
        out["confidence"] = _signal_report(-conf, acc, groups.numpy(), [f"bin {i}" for i in range(b)])
    return out


def revisits(pool_size: int, steps: int, questions_per_step: int) -> dict[str, Any]:
    """How often a run would show each training question: steps * questions_per_step / pool size.

    Per-question state (DIVA's difficulty D_q, VADE's Beta posteriors) learns only from revisits.
    Selectors that re-sample (dapo_filter) or pick by state (vade) spread visits unevenly; this
    is the mean.
    """
    visits = steps * questions_per_step / pool_size if pool_size else 0.0
    return {"distinct_questions": pool_size, "steps": steps, "questions_per_step": questions_per_step,
            "visits_per_question": visits}


# ---------------------------------------------------------------------------------------
# The result and its reports
# ---------------------------------------------------------------------------------------


@dataclass
class AuditResult:
    """Everything `audit` measured; `to_dict` is audit.json."""

    model: str
    data: str
    prompt_template: str
    system_prompt: str
    settings: dict[str, Any]
    pool_size: int
    originals: GroupStats
    question_ids: list[int]  # the audited subset, in audit order
    successes: list[int]  # c_q of each original, [Q]
    kinds: dict[str, KindResult]
    not_built: dict[str, str]  # kind or family -> why it was not audited
    durian: dict[str, Any]
    revisits: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    findings: list[dict[str, Any]] = field(default_factory=list)

    def accuracy_by_kind(self) -> dict[str, tuple[float, float, float]]:
        """kind -> (sampled pass@1, CI lo, CI hi); "original" is the whole audited subset."""
        out = {"original": (self.originals.sampled_pass1, *self.originals.sampled_pass1_ci)}
        for name, k in self.kinds.items():
            out[name] = (k.stats.sampled_pass1, *k.stats.sampled_pass1_ci)
        return out

    @property
    def nothing_parses(self) -> bool:
        """No original response had a readable answer (and none was scored right): every figure is 0."""
        return self.originals.parse_rate == 0 and self.originals.sampled_pass1 == 0

    def verdicts(self) -> dict[str, str]:
        return {name: k.verdict for name, k in self.kinds.items()}

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def summary(self) -> str:
        """The one-screen console summary."""
        return summary_text(self)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def write_report(result: AuditResult, out_dir: Path) -> dict[str, Path]:
    """audit.json, audit.md and audit.png in out_dir (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "audit.json", "markdown": out_dir / "audit.md", "plot": out_dir / "audit.png"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=1))
    plot(result, paths["plot"])
    paths["markdown"].write_text(markdown_text(result, paths["plot"].name))
    return paths


# ---------------------------------------------------------------------------------------
# Findings: what each figure says about the method choice
# ---------------------------------------------------------------------------------------


def _finding(text: str, favours: tuple[str, ...] = (), warns: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"finding": text, "favours": list(favours), "warns": list(warns)}


def _group_findings(o: GroupStats) -> list[dict[str, Any]]:
    g, out = o.group_size, []
    if o.share_all_wrong >= MANY:
        out.append(_finding(f"{o.share_all_wrong:.0%} of groups are all wrong at G={g}: GRPO learns nothing from "
                            "them and sharpening cannot fix them; a hint can turn them mixed",
                            favours=("diva",), warns=("grpo", "dr_grpo", "rloo")))
    elif o.share_all_wrong < FEW:
        out.append(_finding(f"only {o.share_all_wrong:.0%} of groups are all wrong: DIVA's hints have little to "
                            "rescue", warns=("diva",)))
    if o.share_all_right >= MANY:
        out.append(_finding(f"{o.share_all_right:.0%} of groups are all right: zero advantage; dynamic sampling, "
                            "variance-aware selection or harder variants spend the compute elsewhere",
                            favours=("dapo_filter", "vade", "diva")))
    if o.share_mixed >= 1 - FEW:
        out.append(_finding(f"{o.share_mixed:.0%} of groups are mixed: plain GRPO has signal almost everywhere; "
                            "selection and variants gain little", favours=("grpo",), warns=("dapo_filter", "vade")))
    return out


def _variant_findings(kinds: dict[str, KindResult]) -> list[dict[str, Any]]:
    works = [k for k in kinds.values() if k.direction == k.intended]
    idle = [k for k in kinds.values() if k.verdict == "same" and k.intended != "same"]
    inverted = [k for k in kinds.values() if k.verdict == "inverted"]
    out = []
    if works:
        names = ", ".join(f"{k.kind} {k.direction}" for k in works)
        out.append(_finding(f"variants behave as DIVA assumes: {names}", favours=("diva",)))
    if idle:
        names = ", ".join(k.kind for k in idle)
        out.append(_finding(f"no measurable effect (meant to be easier/harder): {names}; such variants only "
                            "repeat the question", warns=("diva",)))
    if inverted:
        names = ", ".join(f"{k.kind} {k.direction} (meant {k.intended})" for k in inverted)
        out.append(_finding(f"INVERTED variants: {names}; DIVA's difficulty labels would point the wrong way. "
                            "Drop them from algorithm.selector.kinds/transforms or fix the base model",
                            warns=("diva",)))
    return out


def _durian_findings(durian: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, label in (("visual_entropy", "visual entropy H"), ("confidence", "low confidence")):
        signal = durian.get(key, {})
        if not signal.get("available"):
            continue
        rho = signal.get("spearman_rho")
        shown = "no spread" if rho is None else f"Spearman rho {rho:+.2f}, p {signal['p_value']:.2g}"
        if signal.get("accuracy_falls"):
            out.append(_finding(f"accuracy falls with {label} ({shown}): Durian's difficulty groups are real",
                                favours=("durian",)))
        else:
            out.append(_finding(f"accuracy does not fall with {label} ({shown}): Durian groups by noise on "
                                "that view", warns=("durian",)))
    return out


def findings_for(result: AuditResult) -> list[dict[str, Any]]:
    """The method each figure favours or warns against (registry names), thresholds in the module constants."""
    if result.nothing_parses:
        return [_finding("nothing parses, so every accuracy is 0 and no figure says anything about the methods; "
                         "fix the prompt template or the model first (see the warning)")]
    out = _group_findings(result.originals) + _variant_findings(result.kinds) + _durian_findings(result.durian)
    r = result.revisits
    visits = r.get("visits_per_question", 0.0)
    if r.get("distinct_questions"):
        text = (f"{r['distinct_questions']} training questions, {r['steps']} steps x {r['questions_per_step']} per "
                f"step: each is seen {visits:.2g} times on average")
        if visits < FEW_VISITS:
            out.append(_finding(text + "; per-question state (DIVA's D, VADE's posteriors) barely moves from its prior",
                                warns=("diva", "vade")))
        else:
            out.append(_finding(text + "; enough revisits for per-question state", favours=("diva", "vade")))
    return out


# ---------------------------------------------------------------------------------------
# Text: the console summary and the markdown report
# ---------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(lo: float, hi: float, signed: bool = False) -> str:
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def _originals_line(o: GroupStats) -> str:
    greedy = "" if o.greedy_pass1 is None else f"greedy {o.greedy_pass1:.3f}  "
    passk = "  ".join(f"{k} {v:.3f}" for k, v in o.pass_at_k.items() if k != "pass@1")
    return (f"all-wrong {_pct(o.share_all_wrong)}  mixed {_pct(o.share_mixed)}  all-right {_pct(o.share_all_right)}"
            f" | {greedy}pass@1 {o.sampled_pass1:.3f} {_ci(*o.sampled_pass1_ci)}  {passk}"
            f" | parsed {_pct(o.parse_rate)}")


def _kind_rows(result: AuditResult) -> list[str]:
    rows = [f"  {'kind':<20}{'n':>5}{'pass@1':>8}{'orig':>7}  {'diff [CI]':<25}{'wrong/right':>12}  verdict"]
    for k in result.kinds.values():
        s = k.stats
        rows.append(f"  {k.kind:<20}{s.questions:>5}{s.sampled_pass1:>8.3f}{k.original_pass1:>7.3f}  "
                    f"{f'{k.difference:+.3f} {_ci(*k.difference_ci, signed=True)}':<25}"
                    f"{f'{s.share_all_wrong:.0%}/{s.share_all_right:.0%}':>12}  {k.verdict}")
    return rows


def _durian_line(durian: dict[str, Any]) -> str:
    parts = []
    for key, label in (("visual_entropy", "entropy (low/mid/high)"), ("confidence", "confidence (least..most)")):
        sig = durian.get(key, {})
        if not sig.get("available"):
            parts.append(f"{label}: n/a ({sig.get('reason', 'not computed')})")
            continue
        accs = "/".join("-" if g["accuracy"] is None else f"{g['accuracy']:.2f}" for g in sig["groups"])
        rho = "n/a" if sig["spearman_rho"] is None else f"{sig['spearman_rho']:+.2f}"
        falls = "falls" if sig["accuracy_falls"] else "does NOT fall"
        parts.append(f"{label} acc {accs} (rho with difficulty {rho}: {falls})")
    return "; ".join(parts)


def summary_text(result: AuditResult) -> str:
    """One screen: warnings, originals, variants with verdicts, Durian, revisits, findings."""
    o, st = result.originals, result.settings
    lines = [f"grpo-zoo audit: {result.model} on {result.data} ({o.questions} questions, G={o.group_size}, "
             f"seed {st.get('seed')}, {result.seconds:.0f} s)"]
    lines += [f"! {w}" for w in result.warnings]
    lines.append("originals: " + _originals_line(o))
    lines.append("  successes 0.." + f"{o.group_size}: " + " ".join(str(n) for n in o.histogram))
    if result.kinds:
        lines.append("variants (diff = variant - original on the same questions, paired bootstrap "
                     f"{int(100 * st.get('level', 0.95))}% CI):")
        lines += _kind_rows(result)
    if result.not_built:
        lines.append("not built: " + "; ".join(f"{k} ({why})" for k, why in result.not_built.items()))
    lines.append("durian: " + _durian_line(result.durian))
    lines.append("findings:")
    for f in result.findings:
        tags = "".join([f" [+{', '.join(f['favours'])}]" if f["favours"] else "",
                        f" [-{', '.join(f['warns'])}]" if f["warns"] else ""])
        lines.append(f"  - {f['finding']}{tags}")
    return "\n".join(lines)


def markdown_text(result: AuditResult, plot_name: str = "audit.png") -> str:
    """audit.md: the same figures as tables, with the plot."""
    o = result.originals
    md = [f"# Audit of `{result.model}` on `{result.data}`", "",
          f"{o.questions} questions of a pool of {result.pool_size}, G = {o.group_size}, "
          f"prompt template `{result.prompt_template!r}`, {result.seconds:.0f} s. Settings: `{result.settings}`", ""]
    md += [f"> **Warning:** {w}" for w in result.warnings] + ([""] if result.warnings else [])
    md += [f"![accuracy by variant kind and success histogram]({plot_name})", "", "## Originals", "",
           "| all-wrong | mixed | all-right | greedy pass@1 | sampled pass@1 [CI] | " +
           " | ".join(k for k in o.pass_at_k if k != "pass@1") + " | parsed |",
           "|" + "---|" * (5 + len(o.pass_at_k)),
           f"| {_pct(o.share_all_wrong)} | {_pct(o.share_mixed)} | {_pct(o.share_all_right)} | "
           f"{'-' if o.greedy_pass1 is None else f'{o.greedy_pass1:.3f}'} | "
           f"{o.sampled_pass1:.3f} {_ci(*o.sampled_pass1_ci)} | "
           + " | ".join(f"{v:.3f}" for k, v in o.pass_at_k.items() if k != "pass@1") + f" | {_pct(o.parse_rate)} |",
           "", "Successes per question (0..G): " + ", ".join(f"{c}: {n}" for c, n in enumerate(o.histogram)), ""]
    md += ["## Variant kinds", "", "| kind | n | pass@1 [CI] | original | diff [CI] | greedy | all-wrong | all-right "
           "| rescued | intended | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in result.kinds.values():
        s = k.stats
        greedy = "-" if s.greedy_pass1 is None else f"{s.greedy_pass1:.3f}"
        rescued = "-" if k.rescued is None else _pct(k.rescued)
        md.append(f"| {k.kind} | {s.questions} | {s.sampled_pass1:.3f} {_ci(*s.sampled_pass1_ci)} | "
                  f"{k.original_pass1:.3f} | {k.difference:+.3f} {_ci(*k.difference_ci, signed=True)} | {greedy} | "
                  f"{_pct(s.share_all_wrong)} | {_pct(s.share_all_right)} | {rescued} | {k.intended} | "
                  f"**{k.verdict}** |")
    md += ["", "rescued: of the questions all wrong as originals, the share with at least one right response "
           "in this kind (what a hint is for)."]
    md += ["", "Verdict: paired bootstrap CI of (variant - original) sampled pass@1 on the same questions; above 0 "
           "easier, below 0 harder, else same; inverted when against the kind's intent (hint easier, "
           "perturbation/only-vision harder, paraphrase same).", ""]
    md += [f"- not built: **{k}**: {why}" for k, why in result.not_built.items()]
    md += ["", "## Durian difficulty signals", "", _durian_line(result.durian), "", "## Revisits", "",
           f"`{json.dumps(result.revisits)}`", "", "## Findings", ""]
    for f in result.findings:
        md.append(f"- {f['finding']} (favours: {', '.join(f['favours']) or '-'}; warns against: "
                  f"{', '.join(f['warns']) or '-'})")
    return "\n".join(md) + "\n"


def plot(result: AuditResult, path: Path) -> None:
    """Sampled pass@1 by kind with CIs (bars coloured by verdict) and the originals' success histogram."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colours = {"original": "#555555", "easier": "#2ca02c", "same": "#1f77b4", "harder": "#ff7f0e",
               "inverted": "#d62728"}
    acc = result.accuracy_by_kind()
    names = list(acc)
    means = np.array([acc[n][0] for n in names])
    err = np.array([[acc[n][0] - acc[n][1] for n in names], [acc[n][2] - acc[n][0] for n in names]]).clip(min=0)
    bar_colours = [colours["original"]] + [colours[result.kinds[n].verdict] for n in names[1:]]
    fig = Figure(figsize=(max(8.0, 4.0 + 0.6 * len(names)), 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[max(2, len(names)), 4])
    ax1.bar(range(len(names)), means, yerr=err, color=bar_colours, capsize=3)
    ax1.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax1.set_ylim(0, 1.15)  # headroom for the legend
    ax1.set_yticks(np.linspace(0, 1, 6))
    ax1.set_ylabel("sampled pass@1 (CI)")
    ax1.set_title("accuracy by variant kind")
    from matplotlib.patches import Patch

    used = ["original", *dict.fromkeys(result.kinds[n].verdict for n in names[1:])]
    ax1.legend(handles=[Patch(color=colours[v], label=v) for v in used], fontsize=7, ncols=len(used), loc="upper right")
    o = result.originals
    ax2.bar(range(o.group_size + 1), o.histogram, color=colours["original"])
    ax2.set_xticks(range(o.group_size + 1))
    ax2.set_xlabel(f"correct responses out of G = {o.group_size}")
    ax2.set_ylabel("questions")
    ax2.set_title("originals: success histogram")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
