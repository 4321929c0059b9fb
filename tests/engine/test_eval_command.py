"""`grpo-zoo eval` on tiny random models: figures by hand, failures counted, runs and checkpoints, the CLI.

A random model never writes a boxed answer, so correctness comes from a test reward that reads
the gold answer: "right" is always correct, "wrong" never, "coin" when the response has an even
number of characters (mixed, so pass@k is not trivial), "boom" raises (a verify failure).
"""

import itertools
import json
import shutil
from math import comb

import pytest
import torch
import yaml

from grpo_zoo.config import load_config
from grpo_zoo.configuration import to_dict
from grpo_zoo.evaluate import EvalOptions, run_eval
from grpo_zoo.evaluate.command import apply_chat_template, load_policy, score_dataset
from grpo_zoo.evaluate.sources import parse_sources, recipe_warnings, run_recipe
from grpo_zoo.evaluation import EvalSettings, QuestionResult, breakdown, pass_at_k, summarise
from grpo_zoo.registry import REWARDS
from grpo_zoo.types import Question

ORACLE = "eval_test_oracle"
BASE = ["model.device=cpu", "reward.num_workers=0", f"reward.functions=[{{name: {ORACLE}, weight: 1.0}}]",
        f"reward.accuracy_function={ORACLE}", "testbed.eval_questions=6"]


@REWARDS.register(ORACLE, description="test only: correctness read off the gold answer")
def oracle(response: str, answer: str, **context) -> float:
    if answer == "boom":
        raise RuntimeError("verifier crashed")
    if answer == "coin":
        return float(len(response) % 2 == 0)
    return 1.0 if answer == "right" else 0.0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's matrices are too small for threads to pay
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from grpo_zoo.testbed.tiny_model import build_tiny_vlm

    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_vlm(root / "m0", seed=0), build_tiny_vlm(root / "m1", seed=1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rows = [{"problem": "Q0", "answer": "right", "subject": "a"},
            {"problem": "Q1", "answer": "wrong", "subject": "a"},
            {"problem": "Q2", "answer": "coin", "subject": "b"},
            {"problem": "Q3", "answer": "right", "subject": "b"},
            {"problem": "Q4", "answer": "", "subject": "b"}]  # unreadable: must be counted, not dropped silently
    path = tmp_path_factory.mktemp("data") / "known.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def options(**kw):
    return EvalOptions(**{"samples": 4, "ks": [1, 2, 4], "max_new_tokens": 5, "progress": False, **kw})


# ----------------------------------------------------------------------------- estimators by hand


def test_pass_at_k_is_the_unbiased_estimator():
    """1 - C(n-c, k)/C(n, k) = P(a random k-subset of the n samples holds a correct one), by enumeration."""
    for n in range(1, 7):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6


def test_summarise_and_breakdown_by_hand():
    def q(qid, subject, greedy, correct):
        return QuestionResult(qid, {"subject": subject}, greedy, correct, [1.0] + [0.0] * len(correct),
                              [10.0] + [2.0] * len(correct))

    results = [q(0, "a", 1, [1, 0, 0, 1]), q(1, "a", 0, [0, 0, 0, 0]), q(2, "b", 1, [1, 1, 1, 1])]
    got = summarise(results, 4, [1, 2, 4])
    assert got["questions"] == 3
    assert got["greedy_accuracy"] == pytest.approx(2 / 3)
    assert got["mean@4"] == pytest.approx((2 / 4 + 0 + 1) / 3)  # 0.5
    assert got["pass@1"] == pytest.approx(0.5)  # pass@1 is the mean accuracy
    assert got["pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3)  # 11/18
    assert got["pass@4"] == pytest.approx(2 / 3)
    assert got["format"] == pytest.approx(3 / 15)  # 3 of 15 responses (the greedy ones) in format
    assert got["response_length"] == pytest.approx((3 * 10 + 12 * 2) / 15)
    rows = breakdown(results, "subject", 4, [2])
    assert [r["value"] for r in rows] == ["a", "b"] and [r["questions"] for r in rows] == [2, 1]
    assert rows[0]["pass@2"] == pytest.approx((5 / 6 + 0) / 2) and rows[1]["mean@4"] == 1.0
    assert summarise([], 4, [2]) == {"questions": 0, "greedy_accuracy": None, "mean@4": None, "pass@2": None,
                                     "format": None, "response_length": None}


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def cli_run(tiny, dataset, tmp_path_factory):
    """Three models (the third = the first again) on the known dataset, through the CLI."""
    from grpo_zoo.cli import main

    out = tmp_path_factory.mktemp("eval")
    m0, m1 = tiny
    sets = [arg for o in [*BASE, "data.max_bad_row_share=0.5"] for arg in ("--set", o)]
    rc = main(["eval", "--model", f"first={m0}", "--model", f"second={m1}", "--model", f"again={m0}",
               "--data", str(dataset), "--samples", "4", "--k", "1,2,4", "--by", "subject",
               "--max-new-tokens", "5", "--no-progress", "--output-dir", str(out), *sets])
    assert rc == 0
    return json.loads((out / "eval.json").read_text()), (out / "eval.md").read_text()


def test_figures_match_a_hand_computation_on_known_answers(cli_run):
    data, _ = cli_run
    block = data["results"]["first"]["known"]
    records = {r["question_id"]: r for r in block["questions"]}
    assert sorted(records) == [0, 1, 2, 3]  # the unreadable row is not a question ...
    assert data["datasets"][0]["skipped_rows"] == 1 and data["datasets"][0]["skip_reasons"] == {"empty answer": 1}
    assert any("1 of 5 rows could not be read" in w for w in data["warnings"])  # ... but is reported
    # Q0 and Q3 always right, Q1 never; Q2 ("coin") as the command recorded it.
    for qid, expected in ((0, 1), (1, 0), (3, 1)):
        assert records[qid]["greedy"] == expected and records[qid]["correct"] == [expected] * 4
    g2, c2 = records[2]["greedy"], sum(records[2]["correct"])
    figures = block["figures"]
    assert figures["questions"] == 4
    assert figures["greedy_accuracy"] == pytest.approx((1 + 0 + g2 + 1) / 4)
    assert figures["mean@4"] == pytest.approx((1 + 0 + c2 / 4 + 1) / 4)
    for k in (1, 2, 4):
        p2 = 1.0 if 4 - c2 < k else 1 - comb(4 - c2, k) / comb(4, k)
        assert figures[f"pass@{k}"] == pytest.approx((1 + 0 + p2 + 1) / 4)
    lengths = [n for r in records.values() for n in r["length"]]
    assert len(lengths) == 4 * 5 and all(1 <= n <= 5 for n in lengths)
    assert figures["response_length"] == pytest.approx(sum(lengths) / 20)
    assert figures["format"] == 0.0  # a random model never writes <think>...</think> \boxed{}
    a, b = block["by"]["subject"]
    assert (a["value"], a["questions"], a["mean@4"], a["pass@4"]) == ("a", 2, 0.5, 0.5)  # Q0 right, Q1 wrong
    assert b["value"] == "b" and b["mean@4"] == pytest.approx((c2 / 4 + 1) / 2)
    assert b["greedy_accuracy"] == pytest.approx((g2 + 1) / 2)
    assert block["failed"] == [] and block["verify_failures"] == 0


def test_several_models_make_one_comparison_table(cli_run):
    data, markdown = cli_run
    assert [m["label"] for m in data["models"]] == ["first", "second", "again"]
    table = markdown.split("## known")[1].split("###")[0]
    assert "| model | greedy | mean@4 | pass@1 | pass@2 | pass@4 | format | length | failed |" in table
    assert all(f"| {label} |" in table for label in ("first", "second", "again"))
    # Every model sees the same seeded random stream: the same weights give the same responses.
    first, again = data["results"]["first"]["known"], data["results"]["again"]["known"]
    assert first["questions"] == again["questions"] and first["figures"] == again["figures"]
    assert "### known by subject" in markdown


def test_unrenderable_and_unverifiable_questions_are_counted(tiny):
    from grpo_zoo.policy import Policy
    from grpo_zoo.reward_runner import RewardRunner

    policy = Policy.from_pretrained(str(tiny[0]))
    questions = [Question(0, "Q0", "right"), Question(1, "<image>Q1", "right"),  # a tag without its image
                 Question(2, "Q2", "boom"), Question(3, "Q3", "wrong")]
    settings = EvalSettings(samples=2, max_new_tokens=3)
    with RewardRunner([(ORACLE, 1.0)], accuracy_function=ORACLE, num_workers=0) as rewards:
        block = score_dataset(policy, questions, rewards, settings, [2], [])
    assert [r["question_id"] for r in block["questions"]] == [0, 2, 3]
    assert block["failed"][0]["question_id"] == 1 and "image" in block["failed"][0]["reason"]
    assert list(block["failure_reasons"].values()) == [1]
    assert block["verify_failures"] == 3  # Q2's greedy + 2 sampled responses
    assert block["figures"]["mean@2"] == pytest.approx(1 / 3)  # Q0 right, Q2 scored 0, Q3 wrong


def test_a_rollout_backend_samples_as_the_policy_does(tiny):
    """The adapter the vLLM path uses, here over the in-process hf backend: same seed, same responses."""
    from grpo_zoo.backends.rollout import HfRollout
    from grpo_zoo.evaluate.command import BackendPolicy
    from grpo_zoo.policy import Policy
    from grpo_zoo.reward_runner import RewardRunner

    policy = Policy.from_pretrained(str(tiny[0]))
    questions = [Question(i, f"Q{i}", "coin") for i in range(3)]
    settings = EvalSettings(samples=3, greedy=False, max_new_tokens=4)
    with RewardRunner([(ORACLE, 1.0)], accuracy_function=ORACLE, num_workers=0) as rewards:
        direct = score_dataset(policy, questions, rewards, settings, [3], [])
        wrapped = score_dataset(BackendPolicy(policy, HfRollout(policy)), questions, rewards, settings, [3], [])
    assert direct["questions"] == wrapped["questions"] and direct["figures"] == wrapped["figures"]


def test_the_figures_are_the_trainers_eval_figures(tiny):
    """Same settings and seed: mean@n, pass@n, greedy and format equal what the trainer logs."""
    from grpo_zoo.evaluation import evaluate
    from grpo_zoo.policy import Policy
    from grpo_zoo.reward_runner import RewardRunner

    policy = Policy.from_pretrained(str(tiny[0]))
    questions = [Question(i, f"Q{i}", "coin") for i in range(5)]
    settings = EvalSettings(samples=3, batch_size=4, max_new_tokens=5)
    with RewardRunner([(ORACLE, 0.9), ("format", 0.1)], accuracy_function=ORACLE, num_workers=0) as rewards:
        trainer = evaluate(policy, questions, rewards, settings)
        ours = score_dataset(policy, questions, rewards, settings, [3], [])["figures"]
    assert ours["mean@3"] == pytest.approx(trainer["eval/pass@1"])
    assert ours["pass@3"] == pytest.approx(trainer["eval/pass@3"])
    assert ours["greedy_accuracy"] == pytest.approx(trainer["eval/greedy_accuracy"])


def test_a_grpo_zoo_run_is_evaluated_with_its_own_recipe_on_the_testbed_split(tiny, tmp_path):
    template = "{problem} Answer in a box."
    cfg = load_config(None, [f"data.prompt_template={template}"])
    run = tmp_path / "myrun"
    shutil.copytree(tiny[0], run / "checkpoints" / "step-000002" / "policy")
    (run / "checkpoints" / "step-000002" / "meta.json").write_text('{"step": 2, "format": 1}')  # complete
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    assert run_recipe(str(run / "checkpoints" / "step-000002" / "policy")) == (run / "config.yaml").resolve()
    assert run_recipe(str(tiny[0])) is None
    result = run_eval([str(run)], ["testbed"], overrides=BASE, options=options(samples=2, ks=None, by=["kind"]))
    assert result.recipe == str((run / "config.yaml").resolve()) and result.settings["template"] == template
    assert result.models[0]["label"] == "myrun/step-000002" and result.models[0]["path"].endswith("policy")
    assert result.datasets[0]["questions"] == 6  # testbed.eval_questions, no file needed
    figures = result.blocks["myrun/step-000002"]["testbed"]["figures"]
    assert set(figures) == {"questions", "greedy_accuracy", "mean@2", "pass@2", "format", "response_length"}
    assert sum(r["questions"] for r in result.blocks["myrun/step-000002"]["testbed"]["by"]["kind"]) == 6
    assert "testbed by kind" in result.summary()
    # A second run trained with another template: a warning names it.
    assert recipe_warnings(load_config(None, BASE), [run / "config.yaml"], BASE)


def test_a_model_without_a_chat_template_needs_one_chosen(tiny):
    from grpo_zoo.policy import Policy
    from grpo_zoo.types import Prompt

    policy = Policy.from_pretrained(str(tiny[0]))
    policy.processor.chat_template = policy.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="--chat-template"):
        apply_chat_template(policy, None, "base")
    apply_chat_template(policy, "none", "base")
    assert policy.encode([Prompt(0, "Q", "1")]).texts == ["Q"]
    apply_chat_template(policy, "{% for m in messages %}<{{ m['role'] }}>{% endfor %}", "base")
    assert policy.encode([Prompt(0, "Q", "1")]).texts == ["<user>"]


def test_bad_inputs_give_clear_errors(tiny, dataset, capsys):
    from grpo_zoo.cli import main

    sets = [arg for o in [*BASE, "data.max_bad_row_share=0.5"] for arg in ("--set", o)]
    common = ["eval", "--model", str(tiny[0]), "--data", str(dataset), "--no-progress", *sets]
    assert main([*common, "--by", "colour"]) == 2
    err = capsys.readouterr().err
    assert "'colour' is not a column" in err and "['subject']" in err
    assert main([*common, "--samples", "2", "--k", "4"]) == 2
    assert "k <= the samples" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny[0]), "--data", "nowhere.jsonl", *sets]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="backend"):
        load_policy(str(tiny[0]), load_config(None, BASE), "vllm")  # no vLLM on this machine


def test_labels_are_short_and_unique():
    got = parse_sources(["runs/a/checkpoints/step-000010/policy", "base=/models/qwen", "/models/qwen", "/x/qwen"],
                        "model")
    assert [s.label for s in got] == ["a/step-000010", "base", "qwen", "qwen#2"]
    assert got[1].path == "/models/qwen"
