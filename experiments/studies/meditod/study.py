"""`medstack run meditod-nlu|meditod-pol|meditod-nlg` through the study runner (declared in __init__.py, with its paper tables).

One case per test turn (tasks.py), one request per turn (step "predict"): ``solve`` makes the typed record (the
prediction is its ``answer``), the scorers (scorers.py) grade it after, the grader's verdicts among them with
``--adjudicate-model`` (steps ``adjudicate:<i>``); then the corpus metrics and summary.md: the run is described in
experiments/studies/meditod/README.md. A failed request is never a format error: the runner records the turn as failed,
leaves it out of every metric and asks it again on the next run. Unparseable model output is a format error.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from experiments.common.markdown import md_table
from experiments.core.config import ConfigError, config_dir
from experiments.core.constraints import Constraint
from experiments.core.record import record
from experiments.core.results import strict_json
from experiments.studies.meditod import metrics as M
from experiments.studies.meditod.constraints import nlu_schema, pol_schema
from experiments.studies.meditod.data import load_dialogs, load_split_ids
from experiments.studies.meditod.ontology import load_ontology
from experiments.studies.meditod.results import upgrade_turn
from experiments.studies.meditod.scorers import SCORERS, adjudications
from experiments.studies.meditod.settings import MeditodSettings
from experiments.studies.meditod.prompts import (PROMPTS, fit_icl_messages, load_tokenizer, make_message_counter, make_token_counter,
                                         parse_icl, parse_sft, prompt_hash, sft_messages, templates_used)
from experiments.studies.meditod.retrieval import load_encoder, retrieve_exemplars
from experiments.studies.meditod.tasks import TASKS, build_samples
from experiments.common.text import bertscore_label
from experiments.core.study import CaseContext, RequestFailed, Study
from experiments.tables.render import run_paper_tables
from models.prompt_format import DONE, adapter_prompt_format, default_prompt_format, render_sft, strip_bos
from models.registry import get_spec
from serving.refs import ModelRef, model_name

CONFIGS = config_dir(__file__)
TASK_LABEL = {"nlu": "NLU", "pol": "POL", "nlg": "NLG"}
MODES = ("icl", "supervised")


def icl_constraint(task: str):
    """The declared format of an in-context prediction (docs/constrained-answers.md): NLU and POL answer JSON of the schema built from
    ontology.yaml (experiments/studies/meditod/constraints.py); NLG is free text. Applied only under answers: constrained."""
    if task == "nlg":
        return None

    schema = (nlu_schema if task == "nlu" else pol_schema)(load_ontology())
    return Constraint.make("json", schema, f"meditod/{task}: experiments/studies/meditod/ontology.yaml")


def context_budget(alias: str, max_tokens: int, margin: int, served: int | None = None) -> int | None:
    """Prompt tokens a request may use: the served context length (the server's ``max_model_len``; else the
    registry's) less ``max_tokens`` and a margin."""
    if served is None:
        try:
            served = get_spec(alias).context_length
        except Exception:  # noqa: BLE001 - unknown alias: no budget known
            return None
    return served - max_tokens - margin


@lru_cache(maxsize=None)
def token_counter(alias: str):
    """The served model's token counter for texts (its tokenizer, loaded once per process), or the estimate."""
    return make_token_counter(alias)


@lru_cache(maxsize=None)
def message_counter(alias: str):
    """Tokens of a chat request as the server renders it (loaded once per process), or the estimate."""
    return make_message_counter(alias)


@lru_cache(maxsize=None)
def tokenizer_of(alias: str):
    return load_tokenizer(alias)


def transcript(sample: dict) -> list[dict]:
    turns = sample["history"] + sample["last_turn"]
    return [{"role": t.split(": ", 1)[0], "text": t.split(": ", 1)[-1]} for t in turns]


def load_samples(s: MeditodSettings) -> list[dict]:
    """Every test turn of the split, ``{"id", "dialog_id", "sample"}``."""
    data_path = Path(s.data)
    dialogs = load_dialogs(data_path)
    test_ids = load_split_ids(Path(s.splits_dir) if s.splits_dir else data_path.parent, s.split, dialogs=dialogs)
    samples = build_samples(dialogs, test_ids, s.task, mode=s.mode, history_size=s.history_size)
    return [{"id": smp["id"], "dialog_id": smp["dialog_id"], "sample": smp} for smp in samples]


def with_exemplars(cases: list[dict], s: MeditodSettings) -> list[dict]:
    """The turns a run takes, each with its retrieved exemplars in in-context mode (retrieved after --limit / --sample:
    the encoder takes seconds to load)."""
    found: list[list[dict]] = [[] for _ in cases]
    if s.mode == "icl" and s.k > 0 and cases:
        data_path = Path(s.data)
        dialogs = load_dialogs(data_path)
        train_ids = load_split_ids(Path(s.splits_dir) if s.splits_dir else data_path.parent, s.train_split, dialogs=dialogs)
        train = build_samples(dialogs, train_ids, s.task, mode="icl", history_size=s.history_size)
        found = retrieve_exemplars([c["sample"] for c in cases], train, s.k, load_encoder(s.encoder))
    return [{**c, "exemplars": ex} for c, ex in zip(cases, found)]


class MeditodStudy(Study):
    """One class for the three commands (meditod-nlu, -pol, -nlg): the task is the command's."""

    settings_cls = MeditodSettings
    roles = ("model", "grader")
    primary_role = "model"
    prompts = PROMPTS
    scorers = SCORERS
    case_noun = "turn"

    def __init__(self):
        self.task = self.name.removeprefix("meditod-")
        if self.task not in TASKS:
            raise ConfigError(f"unknown MediTOD task {self.task!r}; valid tasks: {', '.join(TASKS)}")
        self._counter = None
        self._budget: int | None = None

    def upgrade(self, r: dict, s) -> dict:
        return upgrade_turn(r, s)

    def default_config(self, overrides: dict) -> Path:
        mode = overrides.get("mode") or "icl"
        if mode not in MODES:
            raise ConfigError(f"--mode must be icl or supervised, got {mode!r}")
        return CONFIGS / f"{self.task}_{mode}.yaml"

    def prepare(self, s: MeditodSettings) -> MeditodSettings:
        if s.task != self.task:
            raise ConfigError(f"{self.name}: the config is for task {s.task!r}; use `medstack run meditod-{s.task}` or a {self.task} config")
        if not s.data:
            raise ConfigError("no data: pass --data dialogs.json (MediTOD) or a registered data set name")
        if s.lora and s.mode != "supervised":
            raise ConfigError("--lora serves an adapter for --mode supervised; in-context mode runs the base model")
        if len(s.lora) > 1:
            raise ConfigError(f"--lora: one adapter per run (got {', '.join(s.lora)})")
        roles = dict(s.roles)
        if s.adjudicate_model:  # --adjudicate-model is the grader role's model
            roles["grader"] = str(ModelRef.parse(s.adjudicate_model, where="--adjudicate-model"))
        else:  # no adjudication: the grader role is unused; point it at the model so no server starts for it
            roles["grader"] = roles["model"]
        out = s.out or str(Path("runs") / "meditod" / f"{s.task}-{s.mode}")
        update = {"roles": roles, "out": out}
        if s.mode == "supervised":
            update["prompt_format"] = self._supervised_format(s, model_name(roles["model"]))
        return s.model_copy(update=update)

    @staticmethod
    def _supervised_format(s: MeditodSettings, alias: str) -> str:
        """chat | completion: as set, else as the adapter was trained, else the base's default recipe;
        chat needs the model's tokenizer locally (the request is the chat template's text + ``[answer]``)."""
        trained = adapter_prompt_format(next(iter(s.lora.values()))) if s.lora else None
        fmt = s.prompt_format or trained or default_prompt_format(alias)
        if trained and fmt != trained:
            raise ConfigError(f"prompt_format {fmt!r} but the adapter {next(iter(s.lora.values()))} was trained on {trained!r} "
                              "(its recipe.yaml); drop --set prompt_format")
        if fmt == "chat" and tokenizer_of(alias) is None:
            raise ConfigError(f"--mode supervised with the chat format needs the tokenizer of {alias!r} on this machine "
                              "(its weights folder); or --set prompt_format=completion if the adapter was trained that way")
        return fmt

    def load_cases(self, s: MeditodSettings) -> list[dict]:
        return load_samples(s)

    def expand(self, cases: list[dict], s: MeditodSettings) -> list[dict]:
        return with_exemplars(cases, s)

    async def setup(self, client, s: MeditodSettings, cases: list[dict], out: Path) -> None:
        alias = model_name(s.roles["model"])
        served = None if s.mode == "supervised" else await client.served_context_length("model")
        self._budget = context_budget(alias, s.sampling.turn.max_tokens, s.context_margin, served)
        self._counter = token_counter(alias)

    def request(self, s: MeditodSettings, sample: dict, exemplars: list[dict]) -> tuple[str, list[dict] | str, int]:
        """("chat", messages, exemplars kept) in in-context mode; ("completion", prompt, 0) in supervised mode."""
        alias = model_name(s.roles["model"])
        if s.mode == "supervised":
            tok = tokenizer_of(alias) if s.prompt_format == "chat" else None
            text = render_sft(sft_messages(s.task, sample, with_answer=False), s.prompt_format, tok)
            return "completion", strip_bos(text, tok) if tok else text, 0
        msgs, kept = fit_icl_messages(s.task, sample, exemplars, budget_tokens=self._budget, count_tokens=message_counter(alias))
        return "chat", msgs, kept

    async def solve(self, ctx: CaseContext, case: dict, s: MeditodSettings) -> dict:
        sample, ex = case["sample"], case["exemplars"]
        kind, content, kept = self.request(s, sample, ex)
        if kind == "chat":
            gen = s.sampling.turn.gen()
            try:
                res = await ctx.chat(content, role="model", gen=gen, step="predict", constraint=icl_constraint(s.task),
                                     protocol={"exemplars": (kept, s.k)})  # fewer than k when the context cannot hold them
            except RequestFailed as e:  # fails the case; an input too long even without exemplars says how to make room
                if "context length" not in e.error or kept:
                    raise
                raise RequestFailed(e.step, e.role, e.error + (
                    f" [the input alone does not fit the served context ({self._budget} prompt tokens beside "
                    f"max_tokens {s.sampling.turn.max_tokens}): serve the model with a longer one, `medstack serve --max-model-len N`]"), e.kind) from None
            pred = parse_icl(s.task, res.text)
        else:
            gen = s.sampling.turn.gen(stop=[DONE])
            res = await ctx.complete(content, role="model", gen=gen, step="predict")
            pred = parse_sft(s.task, res.text)
        inputs = {"dialog_id": sample["dialog_id"], "uttr_id": sample["uttr_id"], ("messages" if kind == "chat" else "prompt"): content,
                  "exemplar_ids": [e["id"] for e in ex[:kept]]}
        meta = {"task": s.task, "mode": s.mode, "model": model_name(s.roles["model"]), "lora": next(iter(s.lora), None),
                "prompt_hash": prompt_hash(*templates_used(s.task, s.mode)), "prompt_format": s.prompt_format if kind == "completion" else "chat",
                "exemplars_retrieved": len(ex), "exemplars_kept": kept, "scored": sample["scored"], "output": res.text,
                "finish_reason": (res.finish_reasons or [None])[0], "parse_error": pred is None and s.task != "nlg"}
        return record(sample["id"], sample["dialog_id"], inputs=inputs, target=sample["target"], transcript=transcript(sample),
                      answer=pred, metadata=meta)

    def metrics(self, records: list[dict], s: MeditodSettings) -> dict:
        m = score_records(s, records, self._counter)
        if s.adjudicate_model and s.task != "nlg":
            m["adjudicated"] = adjudicated_scores(s, records)
        m["settings"] = {"task": s.task, "mode": s.mode, "split": s.split, "k": s.k, "model": model_name(s.roles["model"]),
                         "lora": dict(s.lora) or None, "adjudicate_model": s.adjudicate_model,
                         "prompt_hash": prompt_hash(*templates_used(s.task, s.mode)), "context_budget": self._budget}
        return m

    def summary(self, metrics: dict, s: MeditodSettings, run) -> str:
        return summary_markdown(s, metrics, _other_mode_metrics(s, Path(s.out))) + "\n" + run_paper_tables(run, self)


# ------------------------------------------------------------------ scoring and adjudication

def score_records(s: MeditodSettings, records: list[dict], count_tokens=None) -> dict:
    """Metrics over the scored turns (POL/NLG in-context requests at utterance 0 are sent but not scored, as the authors do)."""
    sent = len(records)
    records = [r for r in records if r["metadata"].get("scored", True)]
    if not records:
        return {"turns": 0, "scored_turns": 0, "mean_exemplars_kept": 0.0}
    golds = [r["target"] for r in records]
    preds = [r.get("answer") for r in records]
    if s.task == "nlg":
        preds = [p if isinstance(p, str) else "" for p in preds]
    m = M.score(s.task, golds, preds, dialog_ids=[r["case_id"] for r in records], bertscore=s.bertscore,
                bertscore_encoder=s.bertscore_encoder, bertscore_layer=s.bertscore_layer, max_tokens=s.sampling.turn.max_tokens if s.task == "nlg" else None,
                count_tokens=count_tokens if s.task == "nlg" else None)
    m["mean_exemplars_kept"] = sum(r["metadata"].get("exemplars_kept", 0) for r in records) / len(records)
    m["requests_not_scored"] = sent - len(records)
    return m


def adjudicated_scores(s: MeditodSettings, records: list[dict]) -> dict:
    """Rescore with the grader's judgments; every judgment is also listed in adjudications.jsonl."""
    judged = {r["id"]: adjudications(r) for r in records}
    judgments = {(j["gold"], j["pred"]): j["same"] for js in judged.values() for j in js}
    h = prompt_hash("adjudicate.txt")
    if s.out and Path(s.out).is_dir():
        with open(Path(s.out) / "adjudications.jsonl", "w", encoding="utf-8") as f:
            for r in records:
                for j in judged[r["id"]]:
                    f.write(strict_json({"id": r["id"], **j, "prompt_hash": h}, ensure_ascii=False) + "\n")
    records = [r for r in records if r["metadata"].get("scored", True)]
    if not records:
        return {"turns": 0, "scored_turns": 0, "pairs_judged": 0, "unparsed_verdicts": 0}
    out = M.score(s.task, [r["target"] for r in records], [r.get("answer") for r in records],
                  dialog_ids=[r["case_id"] for r in records], judgments=judgments)
    out["pairs_judged"] = len(judgments)
    out["unparsed_verdicts"] = sum(1 for js in judged.values() for j in js if not j["parsed"])
    return out


# ------------------------------------------------------------------ summary

def _other_mode_metrics(s: MeditodSettings, out: Path) -> tuple[str, dict] | None:
    """Metrics of the other mode's run: --compare DIR, else the sibling folder <task>-<other mode>."""
    other = "supervised" if s.mode == "icl" else "icl"
    cand = Path(s.compare) if s.compare else out.parent / f"{s.task}-{other}"
    f = cand / "metrics.json"
    if cand.resolve() == out.resolve() or not f.exists():
        return None
    m = json.loads(f.read_text())
    return m.get("settings", {}).get("mode", other), m


ROWS = {
    "nlu": [("precision", "P (all)"), ("recall", "R (all)"), ("f1", "F1 (all)"), ("medical_f1", "F1 medical (canonical)"),
            ("non_medical_f1", "F1 non-medical"), ("joint_accuracy", "Joint accuracy"), ("format_error_rate", "Format-error rate")],
    "nlg": [("bleu2", "BLEU-2"), ("bleu4", "BLEU-4"), ("rouge1", "ROUGE-1"), ("rougeL", "ROUGE-L"), ("bertscore_f1", "BERTScore F1")],
}
ROWS["pol"] = ROWS["nlu"] + [("p@1", "P@1"), ("p@4", "P@4"), ("p@8", "P@8"), ("p@inf", "P@inf")]


def _bertscore_used(m: dict) -> tuple | None:
    """(encoder, layer) of a column's BERTScore ((None, None): not recorded); None when the column has none."""
    return None if m.get("bertscore_f1") is None else (m.get("bertscore_encoder"), m.get("bertscore_layer"))


def metrics_table(task: str, columns: list[tuple[str, dict]]) -> str:
    """The metrics table; the BERTScore row names the encoder and layer, and a warning follows the table
    when columns scored BERTScore with different encoders or layers (their values are not comparable)."""
    used = {name: u for name, m in columns if (u := _bertscore_used(m))}
    enc, layer = next(iter(used.values()), (None, None))  # the row label names the first column's
    cell = lambda key, v: "-" if v is None else (f"{v:.2f}" if task == "nlg" and key.startswith("bleu") else f"{v:.4f}")  # noqa: E731
    rows = [[bertscore_label({"encoder": enc, "layer": layer}) if key == "bertscore_f1" and enc else label, *(cell(key, m.get(key)) for _, m in columns)]
            for key, label in ROWS[task]]
    body = "\n".join(md_table(["metric", *(name for name, _ in columns)], rows)) + "\n"
    if len(set(used.values())) > 1:
        body += ("\n**Warning: the BERTScore columns are not comparable** (different encoder or layer): "
                 + "; ".join(f"{name}: " + (f"{e}, layer {n}" if e else "encoder and layer not recorded")
                             for name, (e, n) in used.items()) + ".\n")
    return body


def summary_markdown(s: MeditodSettings, m: dict, other: tuple[str, dict] | None) -> str:
    cols = [(f"{s.mode} ({m['settings']['model']})", m)]
    if "adjudicated" in m:
        cols.append((f"{s.mode} + adjudication", m["adjudicated"]))
    if other:
        cols.append((f"{other[0]} ({other[1].get('settings', {}).get('model', '?')})", other[1]))
    text = (
        f"# MediTOD {TASK_LABEL[s.task]} — {s.mode}, split {s.split}\n\n"
        f"{m.get('turns', 0)} turns ({m.get('scored_turns', m.get('turns', 0))} scored), k={s.k if s.mode == 'icl' else '-'}, "
        f"mean exemplars kept {m.get('mean_exemplars_kept', 0):.2f}, format errors {m.get('format_errors', 0)}\n\n"
        + metrics_table(s.task, cols)
    )
    if m.get("bertscore_encoder"):
        text += f"\nBERTScore: encoder {m['bertscore_encoder']}, layer {m.get('bertscore_layer')} ({m.get('bertscore_layer_source')}).\n"
    gl = m.get("gold_length")
    if gl:
        text += f"\nGold utterances longer than max_tokens={gl['max_tokens']}: {gl['golds_over_cap']} of {gl['golds']}.\n"
    return text

