"""`grpo-zoo audit` on a tiny random model (no warm-up, no download) and its statistics by hand."""

import io
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from grpo_zoo.audit import KIND_NAMES, AuditSettings, audit, plan_kinds, resolve_model
from grpo_zoo.audit_report import (
    bootstrap_mean_ci,
    compare_kind,
    direction_of,
    durian_signals,
    group_stats,
    revisits,
    verdict,
    write_report,
)
from grpo_zoo.config import load_config

VERDICTS = {"easier", "same", "harder", "inverted"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matrices are too small for threads to pay; on a shared machine they cost 3x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_cfg(model_dir, *extra):
    return load_config(None, [f"model.path={model_dir}", "model.device=cpu", "testbed.train_questions=48",
                              "rollout.max_new_tokens=6", "reward.num_workers=0", *extra])


def tiny_settings(**kw):
    base = {"questions": 16, "variant_questions": 4, "group_size": 2, "progress": False, "resamples": 200}
    return AuditSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def full_audit(tiny_model, tmp_path_factory):
    """Every kind, variants sampled even though a random model never parses."""
    result = audit(tiny_cfg(tiny_model), tiny_settings(skip_variants_if_unparsed=False, greedy=False))
    out = tmp_path_factory.mktemp("audit")
    return result, write_report(result, out)


def test_report_has_the_fields_and_shares_sum_to_one(full_audit):
    result, paths = full_audit
    data = json.loads(paths["json"].read_text())
    for key in ("model", "data", "prompt_template", "settings", "pool_size", "originals", "kinds", "not_built",
                "durian", "revisits", "findings", "warnings", "question_ids", "successes"):
        assert key in data, key
    o = data["originals"]
    assert o["questions"] == 16 and o["group_size"] == 2 and sum(o["histogram"]) == 16
    assert o["share_all_wrong"] + o["share_mixed"] + o["share_all_right"] == pytest.approx(1.0)
    assert set(o["pass_at_k"]) == {"pass@1", "pass@2"} and o["greedy_pass1"] is None  # greedy=False
    # The testbed gives every family: hint depths up to its step count, paraphrase, 6 transforms, only-vision.
    assert {"hint_1", "paraphrase", "only_vision"} | {k for k in KIND_NAMES if k.startswith("perturb_")} <= set(
        data["kinds"])
    assert all(k in data["kinds"] or k in data["not_built"] for k in ("hint_1", "hint_2", "hint_3"))
    for name, kind in data["kinds"].items():
        s = kind["stats"]
        assert s["questions"] == 4, name
        assert s["share_all_wrong"] + s["share_mixed"] + s["share_all_right"] == pytest.approx(1.0)
        assert kind["verdict"] in VERDICTS and len(kind["successes"]) == len(kind["original_successes"]) == 4
        assert set(kind["question_ids"]) <= set(data["question_ids"])
    assert set(result.accuracy_by_kind()) == {"original", *data["kinds"]}
    assert data["revisits"]["distinct_questions"] == 48
    assert data["durian"]["visual_entropy"]["available"] and data["durian"]["confidence"]["available"]
    assert paths["plot"].stat().st_size > 1000 and "| verdict |" in paths["markdown"].read_text()


def test_a_model_that_never_parses_gets_a_message_naming_the_template(full_audit):
    result, _ = full_audit
    assert result.originals.parse_rate == 0.0
    message = " ".join(result.warnings)
    assert "data.prompt_template" in message and "'{problem}'" in message and "\\boxed" in message
    assert result.summary().splitlines()[1].startswith("! none of the")


def test_cli_skips_variants_when_nothing_parses(tiny_model, tmp_path, capsys):
    from grpo_zoo.cli import main

    out = tmp_path / "report"
    rc = main(["audit", "--model", str(tiny_model), "--set", "testbed.train_questions=48", "--set",
               "rollout.max_new_tokens=4", "--set", "model.device=cpu", "--set", "reward.num_workers=0",
               "--questions", "4", "--variant-questions", "2", "--group-size", "2", "--no-progress",
               "--kinds", "hint,perturb_noise", "--out", str(out)])
    assert rc == 1  # a report of zeros is written but must not look like a success
    printed = capsys.readouterr().out
    assert "data.prompt_template" in printed
    data = json.loads((out / "audit.json").read_text())
    assert data["kinds"] == {} and "variants" in data["not_built"]
    assert {p.name for p in out.iterdir()} == {"audit.json", "audit.md", "audit.png"}


def test_dataset_without_variant_columns_says_what_it_could_not_build(tiny_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_zoo.testbed.task import make_questions

    rows = make_questions("train", 6, seed=0)
    images = []
    for q in rows:
        buf = io.BytesIO()
        q.images[0].save(buf, format="PNG")
        images.append([buf.getvalue()])
    table = pa.table({"problem": [q.problem for q in rows], "answer": [q.answer for q in rows], "images": images})
    pq.write_table(table, tmp_path / "plain.parquet")
    result = audit(tiny_cfg(tiny_model), tiny_settings(questions=4, variant_questions=2, durian=False,
                                                       skip_variants_if_unparsed=False),
                   data=str(tmp_path / "plain.parquet"))
    assert "hint_steps" in result.not_built["hint"] and "paraphrases" in result.not_built["paraphrase"]
    assert not any(k.startswith(("hint", "paraphrase")) for k in result.kinds)
    assert "perturb_occlude" in result.kinds and "only_vision" in result.kinds
    assert result.pool_size == 6 and result.originals.questions == 4


def test_kinds_follow_the_diva_selector_config_and_the_selection(tiny_model):
    from grpo_zoo.testbed.task import make_questions

    cfg = tiny_cfg(tiny_model, "algorithm.selector.name=diva", "algorithm.selector.kinds=[hint,perturb]",
                   "algorithm.selector.transforms=[noise,blur]")
    from grpo_zoo.audit import diva_config

    kinds, missing = plan_kinds(make_questions("train", 8, 0), diva_config(cfg), is_vlm=True, strength=0.3, cfg=cfg)
    names = [k.name for k in kinds]
    assert names == ["hint_1", "hint_2", "perturb_noise", "perturb_blur"]
    assert missing["paraphrase"] == missing["only_vision"] == "switched off in algorithm.selector.kinds"
    assert "algorithm.selector.transforms" in missing["perturb_rotate"]
    assert kinds[2].plan.num_transforms == 1 and kinds[2].plan.strength == 0.3 and kinds[2].plan.shift == 1
    _, text_only = plan_kinds(make_questions("train", 8, 0), diva_config(cfg), is_vlm=False, strength=0.3, cfg=cfg)
    assert "text-only" in text_only["perturb"]
    with pytest.raises(ValueError, match="unknown kind"):
        AuditSettings(kinds=["hints"]).check()
    with pytest.raises(ValueError, match="questions"):
        AuditSettings(questions=0).check()


def test_model_resolves_from_a_run_directory(tiny_model, tmp_path):
    policy = tmp_path / "run" / "checkpoints" / "step-000002" / "policy"
    shutil.copytree(tiny_model, policy)
    cfg = tiny_cfg(tiny_model)
    assert resolve_model(cfg, str(tmp_path / "run")) == str(policy)
    assert resolve_model(cfg, str(policy.parent)) == str(policy)
    from grpo_zoo.configuration import ConfigError

    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(cfg, str(tmp_path / "nowhere"))


class OraclePolicy:
    """A stand-in policy whose success depends only on the prompt text, so every verdict is known.

    Hinted prompts: all G right. Rotated (the rotation note): none right. Only-vision: all right
    (an inverted "harder" kind). Anything else (originals, paraphrases, other perturbations):
    response 0 of each group right, the rest wrong, so c = 1 of G.
    """

    is_vlm = True

    def encode(self, prompts, template, system_prompt):
        return SimpleNamespace(prompts=prompts, texts=[template.replace("{problem}", p.problem) for p in prompts])

    def generate(self, encoded, group_size, temperature, top_p, max_new_tokens, greedy=False):
        import torch

        from grpo_zoo.variants import ONLY_VISION_PROMPT

        texts = []
        for p in encoded.prompts:
            right = "Hint:" in p.problem or p.problem.startswith(ONLY_VISION_PROMPT)
            wrong = "rotated" in p.problem
            texts += [f"\\boxed{{{p.answer if (right or g == 0) and not wrong else 'no'}}}" for g in range(group_size)]
        n = len(texts)
        return SimpleNamespace(response_texts=texts, prompt_index=torch.arange(len(encoded.prompts)).repeat_interleave(
            group_size), response_mask=torch.ones(n, 3))


def test_verdicts_end_to_end_on_an_oracle_policy(tiny_model):
    cfg = tiny_cfg(tiny_model)
    result = audit(cfg, AuditSettings(questions=12, variant_questions=6, group_size=4, durian=False, progress=False,
                                      resamples=300), model="oracle", policy=OraclePolicy())
    o = result.originals
    assert o.histogram == [0, 12, 0, 0, 0] and o.share_mixed == 1.0 and o.parse_rate == 1.0
    assert o.sampled_pass1 == 0.25 and o.greedy_pass1 == 1.0 and o.pass_at_k["pass@4"] == 1.0
    v = result.verdicts()
    assert v["hint_1"] == v["hint_2"] == "easier"
    assert v["paraphrase"] == "same" and v["perturb_noise"] == "same"
    assert v["perturb_rotate"] == "harder" and v["only_vision"] == "inverted"
    acc = result.accuracy_by_kind()
    assert acc["original"][0] == 0.25 and acc["hint_1"] == (1.0, 1.0, 1.0) and acc["perturb_rotate"][0] == 0.0
    assert result.kinds["hint_1"].difference == pytest.approx(0.75) and result.kinds["hint_1"].original_pass1 == 0.25
    assert not result.warnings and result.model == "oracle"
    text = " ".join(f["finding"] for f in result.findings)
    assert "INVERTED variants: only_vision easier (meant harder)" in text and "groups are mixed" in text
    assert any("diva" in f["warns"] for f in result.findings) and any("diva" in f["favours"] for f in result.findings)


# ---------------------------------------------------------------------------------------
# Statistics by hand
# ---------------------------------------------------------------------------------------


def test_group_stats_by_hand():
    # c = [0, 1, 2, 2] of G = 2: one all-wrong, one mixed, two all-right.
    s = group_stats(np.array([0, 1, 2, 2]), 2, greedy=np.array([0, 1, 1, 1]), resamples=200)
    assert s.histogram == [1, 1, 2]
    assert (s.share_all_wrong, s.share_mixed, s.share_all_right) == (0.25, 0.25, 0.5)
    assert s.sampled_pass1 == pytest.approx((0 + 0.5 + 1 + 1) / 4)  # 0.625
    assert s.pass_at_k["pass@2"] == pytest.approx(0.75)  # any correct among 2: 0, 1, 1, 1
    assert s.greedy_pass1 == 0.75
    assert s.sampled_pass1_ci[0] <= 0.625 <= s.sampled_pass1_ci[1]
    with pytest.raises(ValueError, match="0..2"):
        group_stats(np.array([3]), 2)


@pytest.mark.parametrize(
    "variant, original, family, direction, expected",
    [
        ([2, 2, 2, 2], [0, 0, 0, 0], "hint", "easier", "easier"),  # d = +1 everywhere: CI [1, 1]
        ([2, 2, 2, 2], [0, 0, 0, 0], "perturb", "easier", "inverted"),  # a perturbation that helps
        ([0, 1, 0, 1], [2, 2, 2, 2], "hint", "harder", "inverted"),  # d in {-1, -0.5}: CI below 0
        ([0, 1, 0, 1], [2, 2, 2, 2], "only_vision", "harder", "harder"),
        ([1, 1, 1, 1], [1, 1, 1, 1], "paraphrase", "same", "same"),  # d = 0: CI [0, 0]
        ([0, 1, 0, 1], [2, 2, 2, 2], "paraphrase", "harder", "inverted"),  # a paraphrase must not move it
        ([2, 0, 2, 0], [0, 2, 0, 2], "hint", "same", "same"),  # d = +1, -1, +1, -1: CI spans 0
        ([2, 0, 2, 0], [0, 2, 0, 2], "perturb", "same", "same"),
    ],
)
def test_verdicts_by_hand(variant, original, family, direction, expected):
    k = compare_kind("k", family, np.array(variant), np.array(original), 2, question_ids=[0, 1, 2, 3], resamples=500)
    assert k.direction == direction and k.verdict == expected
    was_wrong = [v for v, o in zip(variant, original) if o == 0]
    assert k.rescued == (np.mean([v > 0 for v in was_wrong]) if was_wrong else None)
    assert k.difference == pytest.approx(np.mean(np.array(variant) - np.array(original)) / 2)
    assert k.difference_ci[0] <= k.difference <= k.difference_ci[1]


def test_direction_and_verdict_rules():
    assert direction_of(0.01, 0.2) == "easier" and direction_of(-0.2, -0.01) == "harder"
    assert direction_of(-0.1, 0.1) == direction_of(0.0, 0.1) == "same"  # touching 0 is not significant
    assert verdict("harder", "easier") == "inverted" and verdict("same", "easier") == "same"
    assert verdict("easier", "harder") == "inverted" and verdict("harder", "harder") == "harder"
    assert verdict("easier", "same") == "inverted" and verdict("same", "same") == "same"


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = np.random.default_rng(0).random(50)
    a, b = bootstrap_mean_ci(values, 500, 0.95, seed=3), bootstrap_mean_ci(values, 500, 0.95, seed=3)
    assert a == b and a[1] < a[0] < a[2]
    assert bootstrap_mean_ci(np.array([0.5]), 100, 0.95, 0) == (0.5, 0.5, 0.5)


def test_durian_signals_and_revisits_by_hand():
    acc = np.linspace(1.0, 0.0, 40)  # accuracy falls ...
    entropy = np.linspace(2.0, 3.0, 40)  # ... as H rises
    confidence = np.linspace(-1.0, -9.0, 40)  # ... and as confidence drops
    out = durian_signals(acc, entropy, confidence, bins=4)
    assert out["visual_entropy"]["accuracy_falls"] and out["visual_entropy"]["spearman_rho"] == pytest.approx(-1.0)
    low, mid, high = (g["accuracy"] for g in out["visual_entropy"]["groups"])
    assert low > mid > high
    assert out["confidence"]["accuracy_falls"] and len(out["confidence"]["groups"]) == 4
    flat = durian_signals(acc, np.full(40, 2.0), None, missing="")
    assert not flat["visual_entropy"]["accuracy_falls"] and flat["visual_entropy"]["spearman_rho"] is None
    assert not flat["confidence"]["available"]
    r = revisits(4000, 120, 8)
    assert r["visits_per_question"] == pytest.approx(0.24) and r["distinct_questions"] == 4000
