"""What tells runs apart (experiments/core/conditions.py): a run's default name, the settings columns, the baseline run."""

from experiments.core.conditions import Effect, baseline_of, conditions, differing, run_name
from experiments.studies.agentclinic.paper_values import bias_paper
from experiments.studies.agentclinic.settings import AgentClinicSettings as S


def test_a_runs_default_name_carries_every_condition_set_otherwise_than_the_defaults():
    assert run_name("gpt-4", S()) == "gpt-4"
    s = S(doctor_bias="recency", inferences=10, concurrency=3, limit=5, out="x", sampling={"doctor": {"temperature": 0.7, "max_tokens": 200}})
    # where it writes, how it reaches its servers and which cases it takes are no conditions
    assert run_name("gpt-4", s) == "gpt-4 inferences=10 doctor_bias=recency sampling.doctor.temperature=0.7"
    assert "name" in S.resume_rules()[1]  # a run named by an older default resumes


def test_columns_are_the_settings_that_differ_among_the_runs():
    cfgs = [{"doctor_bias": "none", "inferences": 10}, {"doctor_bias": "recency", "inferences": 10, "concurrency": 8},
            {"patient_bias": "race", "inferences": 10, "roles": {"doctor": "a"}}]
    assert differing(cfgs, S) == ["doctor_bias", "patient_bias", "roles.doctor"]
    assert differing(cfgs[:1], S) == []


def test_the_baseline_run_has_the_same_models_and_settings_but_the_condition():
    effect = Effect("diagnosis", {"doctor_bias": "none", "patient_bias": "none"}, "bias effect", bias_paper)
    base, other_model = conditions({"roles": {"doctor": "a"}}, S), conditions({"roles": {"doctor": "b"}}, S)
    biased = conditions({"roles": {"doctor": "a"}, "doctor_bias": "race"}, S)
    assert baseline_of(biased, [other_model, biased, base], effect) == 2
    assert baseline_of(biased, [other_model], effect) is None and baseline_of(base, [base], effect) is None
    assert bias_paper(biased) == "GPT-4 97.7, Mixtral 85.8 (doctor implicit biases)"
    assert bias_paper({**biased, "patient_bias": "recency"}) is None  # both agents biased: the paper gives no figure
