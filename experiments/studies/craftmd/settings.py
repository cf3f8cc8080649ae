"""CRAFT-MD run settings (YAML -> this class -> run). Every paper number lives in configs/*.yaml."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from experiments.core.config import NO_FLAG, RunSettings, Sampling, role_flag
from experiments.core.deviations import NOT_FIXED, Authors, Unpaired, settings_deviations
from experiments.common.patient_checks import DEFAULT_SPAN_WORDS

FORMATS = ("vignette", "multiturn", "singleturn", "summarized")
MODES = ("mcq", "frq")
STEPS = ("doctor", "patient", "answer", "summarizer", "grader", "assessor")  # the protocol's steps, each with its sampling

# The authors' request settings (github.com/rajpurkarlab/craft-md, src/models.py, src/utils.py): max_tokens per
# step (open models: generate(max_new_tokens=250); GPT calls: 150; the summary: 500) and, for GPT calls, the API's
# default temperature 1.0 (open models: the model's own generation_config, so no fixed value). No stop sequences
# anywhere; the grader's verdict re-asked while it holds neither yes nor no, at most 11 times (depth 0..10).
AUTHORS_MAX_TOKENS = {"opensource": {"doctor": 250, "answer": 250, "patient": 150, "summarizer": 500, "grader": 150},
                      "gpt": {"doctor": 150, "answer": 150, "patient": 150, "summarizer": 500, "grader": 150}}
AUTHORS_TEMPERATURE = {"opensource": {"patient": 1.0, "summarizer": 1.0, "grader": 1.0},
                       "gpt": {"doctor": 1.0, "answer": 1.0, "patient": 1.0, "summarizer": 1.0, "grader": 1.0}}
AUTHORS_GRADER_REASKS = 11
AUTHORS_TURN_CAP = {"opensource": 14, "gpt": "none"}  # doctor turns: their open-model loop stops at 30 messages; the GPT loop has no cap
SCOPE = Unpaired("which of the authors' measurements a run makes (its scope, stated with the results); each is made as theirs")


def _authors_sampling(table: dict):
    """The authors' value of one sampling field of one role under the run's loop (NOT_FIXED: an open model's own)."""
    return lambda s, role: table[s.loop].get(role, NOT_FIXED)


def _api_default(value):
    """A sampling field the authors' GPT calls left at the API default: fixed where their temperature is."""
    return lambda s, role: value if role in AUTHORS_TEMPERATURE[s.loop] else NOT_FIXED


class CraftSettings(RunSettings):
    cli_flags = (role_flag("clinical", "Doctor-AI: the model under test (alias of --role clinical=REF)."),
                 role_flag("patient", "Patient-AI model (alias of --role patient=REF)."),
                 role_flag("grader", "Grader-AI model; also summarizes and assesses unless --summarizer-model / --assessor-model."),
                 role_flag("summarizer", "Model that turns the patient's statements into a summary."),
                 role_flag("assessor", "Model that asks the conversation-quality questions with --assess-conversations."))

    # every field against the authors' released code (experiments/core/deviations.py; docs/protocols.md, CRAFT-MD)
    authors_table: ClassVar[dict] = {
        "name": Unpaired("the run's label in tables"),
        **dict.fromkeys(("formats", "mcq", "frq", "trials", "specialty"), SCOPE),
        "max_turns": Authors(lambda s: AUTHORS_TURN_CAP[s.loop], says="turn cap {ours} doctor turns (authors: {authors})"),
        "final_marker": Authors("Final Diagnosis", says="final-diagnosis marker {ours} (authors: {authors})"),
        "concurrent_rule": Unpaired("the authors' paper scores an answer naming several diagnoses 0 (zero), their released grader "
                                    "accepts any matching one (any): both are theirs, and every table names the rule it used"),
        "loop": Unpaired("which of the authors' two loops the requests are built as (both theirs); summary.md names it"),
        "turn_stops": Authors(False, says="turn_stops: doctor and patient turns cut at the next speaker label"),
        "summary_stops": Authors(False, says="summary_stops: the summary cut at a blank line"),
        "grader_reasks": Authors(AUTHORS_GRADER_REASKS, says="grader re-asked at most {ours} time(s) (authors: {authors})"),
        "verdict_rule": Authors("anywhere", says="grader verdict read from the reply's first word (authors: yes anywhere in the reply, "
                                "else no anywhere; so a re-ask also follows a reply that holds no verdict word first)"),
        "empty_turn": Authors("", says="an empty turn sent as {ours} (authors: sent empty)"),
        "lone_system_as_user": Authors(False, says="lone_system_as_user: grader and summarizer prompts sent as user messages (authors: system)"),
        "completion_steps": Authors([], says="{ours} sent as text completions (authors: chat)"),
        "sampling.*.stop": Authors(None, says="sampling.{key}.stop: {ours}"),
        "sampling.*.max_tokens": Authors(_authors_sampling(AUTHORS_MAX_TOKENS), says="{key} max_tokens {ours} (authors: {authors})"),
        "sampling.*.temperature": Authors(_authors_sampling(AUTHORS_TEMPERATURE), says="{key} temperature {ours} (authors: {authors})"),
        "sampling.*.top_p": Authors(_api_default(1.0), says="{key} top_p {ours} (authors: {authors}, the API default)"),
        "sampling.*.frequency_penalty": Authors(_api_default(0.0), says="{key} frequency_penalty {ours} (authors: {authors}, the API default)"),
        "sampling.*.n": Authors(1, says="{key} sampled {ours} times per request (authors: {authors})"),
        "patient_prompt": Authors("authors", says="patient instructions {ours} (prompts/patient_system.txt; authors: their get_patient_prompt, "
                                  "prompts/patient_authors.txt): ours add 'if the notes do not say, answer that you are not sure' where "
                                  "the authors' patient, told to add nothing, denies, and 'never name a diagnosis', which forbids history "
                                  "the vignette itself gives (a parent's atopic dermatitis, the patient's type 1 diabetes)"),
        **dict.fromkeys(("assess_conversations", "patient_checks", "copy_span_words"),
                        Unpaired("an addition to the protocol (conversation checks): the paper's requests are unchanged; "
                                 "summary.md names it on its additions line")),
    }

    # settings added after runs were made, with the value every earlier run used (experiments/core/config.py resume_rules):
    # the conversation checks, and the grader verdict and empty turns as every run before these settings read and sent them
    added_settings: ClassVar[dict] = {"assess_conversations": False, "patient_checks": True, "copy_span_words": 12,
                                      "verdict_rule": "first_word", "empty_turn": "...", "patient_prompt": "cautious"}

    name: str | None = Field(None, description="Run name shown by `compare` (default: the clinical model alias).")
    formats: list[Literal[FORMATS]] = Field(list(FORMATS), description="Formats each case is asked in, a comma list (e.g. multiturn,singleturn).")
    mcq: bool = Field(True, description="Ask the 4-choice MCQ.")
    frq: bool = Field(True, description="Ask the free-response question, graded by the grader-AI.")
    trials: int = Field(5, ge=1, description="Trials per case (paper: 5).")
    specialty: str | None = Field(None, description="Only cases of this specialty (the CSV's category column).")
    max_turns: int = Field(14, ge=1, description="Turn cap: doctor turns per conversation.")
    final_marker: str = Field("Final Diagnosis", description="The words that mark the doctor's final diagnosis (ends the conversation).",
                              json_schema_extra=NO_FLAG)
    concurrent_rule: Literal["zero", "any"] = Field("zero", description="FRQ grade of an answer naming several diagnoses: zero (scored 0, "
                                                    "the paper) or any (correct when one matches, the authors' released grader).")
    loop: Literal["opensource", "gpt"] = Field("opensource", description="How the doctor-AI's requests are built: the authors' open-model "
                                               "loop (opensource) or their GPT loop (gpt).")
    # Switches a base model needs, each a deviation from the authors' requests when on (all off in paper.yaml; the
    # table above names every one in summary.md and the paper table's footnote):
    turn_stops: bool = Field(False, description="Doctor and patient turns stop at the next speaker label (a base model writes both sides).",
                             json_schema_extra=NO_FLAG)
    summary_stops: bool = Field(False, description="The summary stops at a blank line or a new example label (a base model runs on).",
                                json_schema_extra=NO_FLAG)
    grader_reasks: int = Field(AUTHORS_GRADER_REASKS, ge=0, description="Re-asks of the grader while its verdict is neither yes nor no.",
                               json_schema_extra=NO_FLAG)
    verdict_rule: Literal["anywhere", "first_word"] = Field("anywhere", description="How a grader verdict is read: anywhere in the reply "
                                                            "(the authors') or its first word.", json_schema_extra=NO_FLAG)
    empty_turn: str = Field("", description="What is sent in place of an empty conversation turn (the authors': empty).", json_schema_extra=NO_FLAG)
    patient_prompt: Literal["authors", "cautious"] = Field("authors", description="The patient-AI's instructions: the authors' (authors) "
                                                           "or ours with 'not sure' and 'never name a diagnosis' (cautious).",
                                                           json_schema_extra=NO_FLAG)
    # chat templates such as Gemma 3's drop a conversation that is only a system message
    lone_system_as_user: bool = Field(False, description="The grader's and summarizer's one-message prompts sent as a user message "
                                      "(the authors': system).", json_schema_extra=NO_FLAG)
    # Additions to the protocol (not deviations: the paper's requests are unchanged; named in summary.md, additions()):
    assess_conversations: bool = Field(False, description="Conversation assessors (an addition to the paper's protocol): the assessor model "
                                       "answers Q1-Q3 and two patient-AI questions (grounded, complete) of each conversation, yes/no.")
    patient_checks: bool = Field(True, description="Deterministic patient checks, no model: the diagnosis leaked, another choice named, "
                                 "an unsupported confirmation, a hedged suggestion, a character break, script talk, clinical vignette wording "
                                 "copied, no reply (an empty turn).")
    copy_span_words: int = Field(DEFAULT_SPAN_WORDS, ge=2, description="Patient check: consecutive vignette words with clinical content a patient "
                                 "turn must share to count as copied (4 suffice with a lab value, gene or number with a unit).")
    roles: dict[str, str] = {"clinical": "embedded", "patient": "embedded", "grader": "embedded", "summarizer": "embedded"}
    sampling: dict[Literal[STEPS], Sampling] = Field({
        "doctor": Sampling(temperature=1.0, max_tokens=250),
        "patient": Sampling(temperature=1.0, max_tokens=150),
        "answer": Sampling(temperature=1.0, max_tokens=250),
        "summarizer": Sampling(temperature=1.0, max_tokens=500),
        "grader": Sampling(temperature=1.0, max_tokens=150),
    }, description="Sampling of each step: doctor, patient, answer, summarizer, grader (and assessor) (sampling.STEP.FIELD, "
       "e.g. --set sampling.doctor.max_tokens=200).", json_schema_extra=NO_FLAG)
    completion_steps: list[Literal["answer", "grader", "summarizer", "assessor"]] = Field(
        [], description="Steps sent as plain text completions instead of chat (for base models).", json_schema_extra=NO_FLAG)
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"  # "auto": 256 per GPU, 16 on CPU, bounded by the KV caches

    @field_validator("formats", mode="before")
    @classmethod
    def _formats(cls, v):
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        bad = [x for x in v if x not in FORMATS]
        if bad:
            raise ValueError(f"unknown format(s) {', '.join(bad)}; valid: {', '.join(FORMATS)}")
        return list(v)

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, v):
        missing = {"doctor", "patient", "answer", "summarizer", "grader"} - set(v)
        if missing:
            raise ValueError(f"sampling needs entries for: {', '.join(sorted(missing))}")
        return v

    @model_validator(mode="after")
    def _assessor(self):
        """With assess_conversations, the assessor defaults to the grader's model and sampling (set either to change it);
        without, neither the role nor its sampling is added (the settings of earlier runs stay as they were)."""
        if self.assess_conversations:
            if "assessor" not in self.roles and "grader" in self.roles:
                self.roles = {**self.roles, "assessor": self.roles["grader"]}
            if "assessor" not in self.sampling:
                self.sampling = {**self.sampling, "assessor": self.sampling["grader"]}
        return self


def loop_line(s: CraftSettings) -> str:
    loop = "open-model loop (craftmd_opensource)" if s.loop == "opensource" else "GPT loop (craftmd_gpt)"
    return f"requests: built as the authors' {loop}"


def additions(s: CraftSettings) -> list[str]:
    """What this run does beyond the paper's protocol without changing its requests (empty for paper.yaml but the patient checks)."""
    out = []
    if s.assess_conversations:
        out.append("assess_conversations: LLM assessors (role assessor) answer Q1-Q3 and two patient-AI questions of each conversation")
    if s.patient_checks:
        out.append(f"patient_checks: deterministic checks of the patient-AI, no model (copied span: {s.copy_span_words} words)")
    return out


def requests_line(s: CraftSettings) -> str:
    """How the requests were built, for summary.md and --dry-run."""
    devs = settings_deviations(s)  # one phrase per row of CraftSettings.authors_table that differs
    return f"{loop_line(s)}; deviations from the authors' requests: " + ("; ".join(devs) if devs else "none")


class MeldSampling(BaseModel):
    """Sampling of MELD's one step (``sampling.continuation``)."""

    model_config = ConfigDict(extra="forbid")

    continuation: Sampling = Field(Sampling(temperature=0.0, max_tokens=512), description="The model continues the vignette's first half; "
                                   "max_tokens is capped per case at twice the second half's words + 16.")


class MeldSettings(RunSettings):
    # the authors' MELD script (src/meld_distance.py): one GPT-4 call at the API defaults (temperature 1, max_tokens 150)
    authors_table: ClassVar[dict] = {
        "threshold": Authors(0.95, says="memorization threshold {ours} (authors: {authors})"),
        "sampling.continuation.temperature": Authors(1.0, says="temperature {ours} (authors: {authors}, the API default)"),
        "sampling.continuation.max_tokens": Authors(150, says="max_tokens {ours}, capped per case at twice the second half's words + 16 "
                                                    "(authors: {authors})"),
        "sampling.continuation.top_p": Authors(1.0, says="top_p {ours} (authors: {authors}, the API default)"),
        "sampling.continuation.frequency_penalty": Authors(0.0, says="frequency_penalty {ours} (authors: {authors}, the API default)"),
        "sampling.continuation.n": Authors(1, says="sampled {ours} times per request (authors: {authors})"),
        "sampling.continuation.stop": Authors(None, says="stop: {ours} (authors: none)"),
    }

    moved_keys: ClassVar[dict] = {"temperature": "sampling.continuation.temperature",  # older spellings
                                  "max_tokens": "sampling.continuation.max_tokens"}
    roles: dict[str, str] = {"model": "embedded"}
    threshold: float = Field(0.95, ge=0.0, le=1.0, description="Similarity treated as memorized (default 0.95).")
    sampling: MeldSampling = Field(MeldSampling(), description="Sampling of the continuation (sampling.continuation.FIELD).",
                                   json_schema_extra=NO_FLAG)
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = 16

