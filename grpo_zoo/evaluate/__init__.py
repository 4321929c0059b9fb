"""`grpo-zoo eval`: held-out evaluation of one or more models (command) and its report (report)."""

from grpo_zoo.evaluate.command import EvalOptions, run_cli, run_eval
from grpo_zoo.evaluate.report import EvalResult, write_report

__all__ = ["EvalOptions", "EvalResult", "run_cli", "run_eval", "write_report"]
