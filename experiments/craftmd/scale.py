"""CRAFT-MD's paper-scale workload over synthetic cases (``Study.runner_scale``): what `medstack bench
--runner-scale` runs through the real runner against a stand-in endpoint (docs/protocols.md, Paper scale).

10,000 case-trials by default (2,000 synthetic cases x 5 trials), all four formats, MCQ and FRQ, the real protocol
(``experiments.craftmd.protocol``: turns that wait for the previous turn, prompts that grow, ~35 calls per
case-trial). The synthetic cases are shaped as the published case set's (a ~650-character vignette, four choices, a
question, a specialty); nothing is read from a data set.
"""

from __future__ import annotations


SPECIALTIES = ("Dermatology", "Cardiology", "Neurology", "Gastroenterology", "Pulmonology", "Endocrinology")
VIGNETTE = ("A {age}-year-old patient presents with complaint number {i}: a {days}-day history of symptoms that began "
            "gradually and have worsened over the last few days. The patient reports intermittent discomfort, mild fatigue "
            "and poor sleep, and denies recent travel or sick contacts. Past history includes seasonal allergies; there are "
            "no regular medicines. On examination the temperature is 37.{t} C, pulse {pulse}/min and blood pressure "
            "12{bp}/8{bp} mmHg. Findings localised to the affected area are described in detail by the examining clinician, "
            "with no lymphadenopathy. Laboratory studies, including a complete blood count, are within normal limits.")


def synthetic_cases(n: int) -> list[dict]:
    """n synthetic cases (the fields ``experiments.craftmd.data.load_csv`` produces)."""
    out = []
    for i in range(n):
        choices = [f"Condition {(i + k) % 40}" for k in range(4)]
        out.append({"case_id": f"case_{i}", "vignette": VIGNETTE.format(age=20 + i % 60, i=i, days=2 + i % 25, t=i % 10, pulse=60 + i % 40, bp=i % 10),
                    "question": "What is the most likely diagnosis?", "question_source": "synthetic", "choices": choices,
                    "answer": choices[i % 4], "answer_index": i % 4, "specialty": SPECIALTIES[i % len(SPECIALTIES)],
                    "dataset": "synthetic", "source": f"synthetic:{i}"})
    return out


def runner_scale(cls, case_trials: int, trials: int, ref: str):
    """``cls`` (the CRAFT-MD study) over synthetic cases, the paper run's call pattern, and its settings: the paper
    config (all formats, MCQ + FRQ, 14-turn cap, sampled turns), every role but the assessor (off) on ``ref``."""

    class RunnerScaleStudy(cls):
        name = "craftmd-runner-scale"

        def prepare(self, s):
            return s.model_copy(update={"name": s.name or "instant"})

        def load_cases(self, s):
            return self.units_for(synthetic_cases(-(-case_trials // s.trials)), s.trials)[:case_trials]

    return RunnerScaleStudy(), {"trials": trials, "data": "synthetic", "roles": {r: ref for r in ("clinical", "patient", "grader", "summarizer")}}
