"""The results of `grpo-zoo eval`: one comparison table per dataset, breakdowns, eval.json and eval.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_zoo.bench_report import plain

SHORT = {"greedy_accuracy": "greedy", "response_length": "length", "questions": "n"}


@dataclass
class EvalResult:
    """Every model on every dataset.

    blocks[model label][dataset label] = {"figures": summarise(...), "by": {column: breakdown rows},
    "failed": [{question_id, reason}], "failure_reasons": {reason: count}, "verify_failures": int,
    "questions": [QuestionResult as dict]}.
    """

    recipe: str
    settings: dict[str, Any]  # EvalSettings fields + ks, by, backend, chat_template, limit, reward
    models: list[dict[str, str]]  # label, model (as given), path (the HF directory loaded)
    datasets: list[dict[str, Any]]  # label, source, rows, questions, skipped_rows, skip_reasons
    blocks: dict[str, dict[str, dict[str, Any]]]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def figure_names(self) -> list[str]:
        """The figures every block has, in table order."""
        s = self.settings
        names = ["greedy_accuracy"] if s["greedy"] else []
        if s["samples"] > 0:
            names += [f"mean@{s['samples']}", *(f"pass@{k}" for k in s["ks"])]
        return [*names, "format", "response_length"]

    def main_figure(self) -> str:
        """The headline figure: sampled mean@n (the trainer's eval/pass@1), else greedy accuracy."""
        return f"mean@{self.settings['samples']}" if self.settings["samples"] > 0 else "greedy_accuracy"

    def figure(self, model: str, dataset: str, name: str) -> float | None:
        return self.blocks[model][dataset]["figures"].get(name)

    def to_dict(self) -> dict[str, Any]:
        return plain({"recipe": self.recipe, "settings": self.settings, "models": self.models,
                          "datasets": self.datasets, "results": self.blocks, "warnings": self.warnings,
                          "seconds": self.seconds})

    def summary(self) -> str:
        """The console report: a comparison table per dataset, then the breakdowns and warnings."""
        return "\n".join(self._lines(markdown=False))

    def markdown(self) -> str:
        return "\n".join(self._lines(markdown=True)) + "\n"

    def _lines(self, markdown: bool) -> list[str]:
        table = markdown_table if markdown else aligned_table
        s = self.settings
        sampling = f"{s['samples']} samples (T {s['temperature']}, top-p {s['top_p']}, seed {s['seed']})"
        reward = " + ".join(f"{w} {n}" for n, w in s["reward"])
        lines = [("# " if markdown else "") + f"grpo-zoo eval: {len(self.models)} model(s), "
                 f"{len(self.datasets)} dataset(s), {self.seconds:.1f} s",
                 f"recipe {self.recipe}; template {s['template']!r}, system prompt {s['system_prompt']!r}; "
                 f"{'greedy + ' if s['greedy'] else ''}{sampling}; <= {s['max_new_tokens']} new tokens; "
                 f"reward {reward} (correct: {s['accuracy_function']} >= 0.5); backend {s['backend']}"]
        names = self.figure_names()
        for d in self.datasets:
            label = d["label"]
            lines += ["", ("## " if markdown else "") + f"{label}: {d['questions']} questions ({d['source']})"]
            rows = [[m["label"], *(fmt(self.figure(m["label"], label, n), n) for n in names),
                     str(len(self.blocks[m["label"]][label]["failed"]))] for m in self.models]
            lines += table(["model", *(SHORT.get(n, n) for n in names), "failed"], rows)
            for column in s["by"]:
                lines += ["", ("### " if markdown else "  ") + f"{label} by {column}"]
                lines += self._breakdown(label, column, names, table, markdown)
        if self.warnings:
            lines += ["", "## Warnings" if markdown else "warnings:"]
            lines += [("- " if markdown else "! ") + w for w in self.warnings]
        return lines

    def _breakdown(self, dataset: str, column: str, names: list[str], table: Any, markdown: bool) -> list[str]:
        """Markdown: every figure per (value, model); console: the headline figure, one column per model."""
        per_model = {m["label"]: self.blocks[m["label"]][dataset]["by"][column] for m in self.models}
        values = list(dict.fromkeys(row["value"] for rows in per_model.values() for row in rows))
        by_value = {m: {str(r["value"]): r for r in rows} for m, rows in per_model.items()}
        if markdown:
            rows = [[str(v), m, *(fmt(by_value[m].get(str(v), {}).get(n), n) for n in ["questions", *names])]
                    for v in values for m in per_model]
            return table([column, "model", "n", *(SHORT.get(n, n) for n in names)], rows)
        main = self.main_figure()
        rows = [[str(v), str(next(iter(by_value.values())).get(str(v), {}).get("questions", "-")),
                 *(fmt(by_value[m].get(str(v), {}).get(main), main) for m in per_model)] for v in values]
        return table([column, "n", *(f"{m} {SHORT.get(main, main)}" for m in per_model)], rows)


def fmt(value: Any, name: str = "") -> str:
    """A figure for a table: shares with 3 decimals, lengths with 1, counts as integers, None as '-'."""
    if value is None:
        return "-"
    if name == "questions" or isinstance(value, int):
        return str(value)
    return f"{value:.1f}" if name == "response_length" else f"{value:.3f}"


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(r) + " |" for r in rows)]


def aligned_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Space-aligned columns for the console: the first left-aligned, the figures right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    return ["  " + "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
            for r in [headers, *rows]]


def write_report(result: EvalResult, out_dir: Path) -> dict[str, Path]:
    """eval.json (every figure, breakdown, failure and per-question result) and eval.md in out_dir (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "eval.json", "markdown": out_dir / "eval.md"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=1))
    paths["markdown"].write_text(result.markdown())
    return paths
