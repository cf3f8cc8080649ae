"""AgentClinic's settings: YAML (configs/*.yaml) -> pydantic -> run. Each field is set against the authors'
``agentclinic.py`` in :attr:`AgentClinicSettings.authors_table` (docs/protocols.md, AgentClinic)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from experiments.core.config import NO_FLAG, RunSettings, Sampling
from experiments.core.deviations import Authors, Unpaired

IMPLICIT = ("gender", "race", "sexual_orientation", "cultural", "education", "religion", "socioeconomic")
DOCTOR_BIASES = ("none", "recency", "frequency", "false_consensus", "confirmation", "status_quo") + IMPLICIT  # the authors' 12
PATIENT_BIASES = ("none", "recency", "frequency", "false_consensus", "self_diagnosis") + IMPLICIT  # the authors' 11
AUTHORS_SAMPLING = Sampling(temperature=0.05, max_tokens=200)  # every agent's request to an OpenAI model


class AgentSampling(BaseModel):
    """Sampling of each agent's requests (``sampling.AGENT``)."""

    model_config = ConfigDict(extra="forbid")

    doctor: Sampling = Field(AUTHORS_SAMPLING, description="The doctor's turns.")
    patient: Sampling = Field(AUTHORS_SAMPLING, description="The patient's replies.")
    measurement: Sampling = Field(AUTHORS_SAMPLING, description="The measurement agent's test results.")
    moderator: Sampling = Field(AUTHORS_SAMPLING, description="The moderator's yes/no.")


class AgentClinicSettings(RunSettings):
    authors_table: ClassVar[dict] = {
        "name": Unpaired("the run's label in tables"),
        "inferences": Authors(20, says="doctor budget {ours} inferences (authors: {authors}, their default)"),
        **dict.fromkeys(("doctor_bias", "patient_bias"), Unpaired("the condition a bias run measures (the authors' own variants)")),
        "verdict_rule": Authors("exact", says="moderator verdict read by rule {ours} (authors: the whole reply lower-cased must equal 'yes')"),
        "final_notice": Authors(True, says="final-request notice {ours} (authors: on at their HEAD b6570ed; off in their code of "
                                           "13 May to 1 June 2024)"),
        "collapse_whitespace": Authors(True, says="replies' whitespace collapsed {ours} (authors: on at their HEAD b6570ed; off "
                                                  "in their code of 13 May to 1 June 2024)"),
        "doctor_actions": Authors([], says="the doctor's action per turn fixed to {ours} by a reply format (a demo deviation, so a small "
                                           "model reaches every branch; authors: the doctor chooses)"),
        **{f"sampling.{agent}.{f}": Authors(getattr(AUTHORS_SAMPLING, f), says=f"{agent} {f} {{ours}} (authors: {{authors}})")
           for agent in AgentSampling.model_fields for f in Sampling.model_fields},
    }

    # the name is a label: a run named by an older default (the model alone) resumes under today's
    resume_changeable: ClassVar[frozenset[str]] = frozenset({"name"})

    name: str | None = Field(None, description="Run name shown by `compare` (default: the doctor model alias and every "
                             "condition set otherwise than the defaults, e.g. `gpt-4 doctor_bias=recency`).")
    data: str | None = Field("agentclinic-medqa", description="AgentClinic OSCE .jsonl (one OSCE_Examination per line) or a registered data set name "
                             "(agentclinic-medqa, agentclinic-medqa-ext).")
    inferences: int = Field(20, ge=1, description="The doctor's budget of inferences (patient questions and test requests together).")
    doctor_bias: Literal[DOCTOR_BIASES] = Field("none", description="A cognitive or implicit bias, a trait of the doctor described in its prompt (prompts/biases.yaml).")
    patient_bias: Literal[PATIENT_BIASES] = Field("none", description="A cognitive or implicit bias, a trait of the patient described in its prompt (prompts/biases.yaml).")
    verdict_rule: Literal["exact", "first_word"] = Field("exact", description="exact: the moderator's reply lower-cased equals 'yes' (the "
                                                         "authors'; 'Yes.' is a no); first_word: its first word yes/no, else unscored.")
    final_notice: bool = Field(True, description="Append the final-request notice to the reply the doctor reads on its last "
                               "inference (their HEAD; their code of 13 May to 1 June 2024 had none).")
    collapse_whitespace: bool = Field(True, description="Collapse each reply's whitespace runs to one space before it is used "
                                      "(their HEAD's GPT path; their code of 13 May to 1 June 2024 did not).")
    doctor_actions: list[Literal["ask", "test", "diagnose"]] = Field(
        [], description="Demo only: the doctor's k-th reply constrained to one action (ask: a question; test: REQUEST TEST: ...; "
                        "diagnose: DIAGNOSIS READY: ...), the last repeating; needs answers: constrained. Empty: the doctor chooses "
                        "(the authors').")
    sampling: AgentSampling = Field(AgentSampling(), description="Sampling of each agent (sampling.AGENT.FIELD, e.g. --set "
                                    "sampling.doctor.max_tokens=100).", json_schema_extra=NO_FLAG)
