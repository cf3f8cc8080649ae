"""What a study is, for the runner: roles + prompts + cases + a solver + metrics (docs/layout.md, "Adding a study").

:class:`CaseContext` is the one call log (docs/running-studies.md, "Resume mid-conversation") and the one place
where constrained answers are applied (docs/constrained-answers.md).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, ClassVar

from dataclasses import dataclass, replace

from experiments.core.config import RunSettings
from experiments.core.scorers import Scorer
from experiments.core.constraints import Constraint
from experiments.core.deviations import check_protocol
from experiments.core.prompts import PromptSet
from models.errors import MedstackError
from serving.client import ChatResult, ErrorKind, GenConfig, LLMClient


class EndpointAuthError(MedstackError):
    """An endpoint refused our key (HTTP 401/403): fatal for the run, never a failed case (exit 2)."""


class RequestFailed(Exception):
    """A model call that got no answer (server down, timeout, HTTP error): the case fails, it is not scored.
    ``kind`` is the client's :data:`~serving.client.ErrorKind` (None: a failure the client did not classify)."""

    def __init__(self, step: str, role: str, error: str, kind: ErrorKind | None = None):
        super().__init__(f"{step} ({role}): {error}")
        self.step, self.role, self.error, self.kind = step, role, error, kind

    def auth_error(self) -> EndpointAuthError:
        return EndpointAuthError(
            f"{self.error} (role {self.role}). The run stops here, without retrying: pass the endpoint's key with "
            "--api-key KEY or $MEDSTACK_API_KEY (the key its server was started with); finished records are kept"
        )


def call_seed(base: int, case_id: str, key: str) -> int:
    return int(hashlib.sha256(f"{base}:{case_id}:{key}".encode()).hexdigest()[:8], 16) % (2**31 - 1)


CURRENT_CASE: ContextVar[str | None] = ContextVar("medstack_case", default=None)  # the case whose task is running (a dry run's stand-ins count per case)


class CaseContext:
    """One case's access to the models, and the log of every call it made."""

    def __init__(self, client: LLMClient, case_id: str, seed: int = 0, answers: str = "free"):
        self.client = client
        self.case_id = str(case_id)
        CURRENT_CASE.set(self.case_id)  # each case runs in a task of its own: this names it to what the task calls
        self.seed = seed
        self.answers = answers  # free | constrained (RunSettings.answers)
        self.calls: list[dict] = []
        self._occurrences: Counter = Counter()
        self._last_finished: int | None = None

    async def chat(self, messages: list[dict], *, role: str, gen: GenConfig, step: str, constraint: Constraint | None = None,
                   protocol: dict | None = None) -> ChatResult:
        return await self._call("chat", messages, role, gen, step, constraint, protocol)

    async def complete(self, prompt: str, *, role: str, gen: GenConfig, step: str, constraint: Constraint | None = None,
                       protocol: dict | None = None) -> ChatResult:
        return await self._call("completion", prompt, role, gen, step, constraint, protocol)

    async def _call(self, kind: str, content: Any, role: str, gen: GenConfig, step: str, constraint: Constraint | None = None,
                    protocol: dict | None = None) -> ChatResult:
        """``protocol``: {quantity: (sent, asked)} where this request may carry less than the protocol asks
        (experiments/core/deviations.py); kept on the entry and summed into the record and metrics.json."""
        n = self._occurrences[step]
        self._occurrences[step] += 1
        key = f"{step}#{n}"
        if gen.temperature > 0:  # sampled: a per-call seed makes it reproducible and cacheable
            gen = gen.replace(seed=call_seed(self.seed, self.case_id, key))
        applied = constraint if constraint is not None and self.answers == "constrained" else None
        if applied is not None:  # its free text bounded ($words) to end inside the step's max_tokens
            applied = applied.bounded(gen.max_tokens)
            gen = gen.replace(structured=applied.request_json())
        entry: dict = {"index": len(self.calls), "role": role, "step": step, "kind": kind,
                       ("messages" if kind == "chat" else "prompt"): content,
                       "gen": {"temperature": gen.temperature, "top_p": gen.top_p, "max_tokens": gen.max_tokens,
                               "frequency_penalty": gen.frequency_penalty, "n": gen.n,
                               "stop": list(gen.stop) if gen.stop else None, "seed": gen.seed,
                               **({"structured": applied.request()} if applied is not None else {})},
                       "after": self._last_finished, "t_start": round(time.time(), 3)}
        if constraint is not None:
            entry["constraint"] = {**(applied or constraint).log(), "applied": applied is not None}
        if protocol:
            entry["protocol"] = check_protocol(protocol, step)
        self.calls.append(entry)
        send = self.client.chat if kind == "chat" else self.client.complete
        result = await send(content, role=role, gen=gen)
        entry.update({"t_end": round(time.time(), 3), "texts": result.texts, "finish_reasons": result.finish_reasons,
                      "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                      "latency": round(result.latency, 3), "cached": result.cached, "cache_key": result.key, "error": result.error})
        self._last_finished = entry["index"]
        if not result.ok:
            raise RequestFailed(step, role, result.error or "no answer", result.error_kind)
        if constraint is not None:
            entry["format_ok"] = format_ok(applied or constraint, result)
            if applied is not None and not all(entry["format_ok"]):  # cut at max_tokens / a stop: no answer, counted by the step's parser
                result = replace(result, texts=[t if ok else "" for t, ok in zip(result.texts, entry["format_ok"])])
        return result

    def usage(self) -> dict:
        """Per-role and total calls, tokens, model seconds and cache hits of this case."""
        out: dict[str, dict] = {}
        for c in self.calls:
            for key in (c["role"], "total"):
                u = out.setdefault(key, {"calls": 0, "cached": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0})
                u["calls"] += 1
                u["cached"] += int(bool(c.get("cached")))
                u["failed"] += int(bool(c.get("error")))
                u["prompt_tokens"] += c.get("prompt_tokens") or 0
                u["completion_tokens"] += c.get("completion_tokens") or 0
                u["seconds"] = round(u["seconds"] + (c.get("latency") or 0.0), 3)
        return out


def format_ok(constraint: Constraint, result: ChatResult) -> list[bool]:
    """Per completion: the reply obeys the declared format (whole reply) and was not cut at max_tokens."""
    reasons = list(result.finish_reasons) + [""] * (len(result.texts) - len(result.finish_reasons))
    return [reason != "length" and constraint.check(text) is not False for text, reason in zip(result.texts, reasons)]


def format_stats(records: list[dict]) -> dict:
    """Replies of steps with a declared format and how many obeyed it, per step kind: from each record's
    ``answer_formats`` (written by the runner with the record) or, for older records, from its call log."""
    out: dict = {"calls": 0, "constrained_calls": 0, "replies": 0, "replies_in_format": 0, "by_template": {}}
    for r in records:
        part = r.get("answer_formats") or (call_formats(r.get("calls") or []) if r.get("calls") else None)
        if not part:
            continue
        for k in ("calls", "constrained_calls", "replies", "replies_in_format"):
            out[k] += part.get(k, 0)
        for name, t in (part.get("by_template") or {}).items():
            mine = out["by_template"].setdefault(name, {"replies": 0, "in_format": 0})
            mine["replies"] += t["replies"]
            mine["in_format"] += t["in_format"]
    return out


def call_formats(calls: list[dict]) -> dict:
    """One case's call log -> its format counts (the shape :func:`format_stats` sums)."""
    out: dict = {"calls": 0, "constrained_calls": 0, "replies": 0, "replies_in_format": 0, "by_template": {}}
    for c in calls:
        if not c.get("constraint") or "format_ok" not in c:
            continue
        out["calls"] += 1
        out["constrained_calls"] += int(bool(c["constraint"].get("applied")))
        t = out["by_template"].setdefault(c["constraint"].get("declared_by") or c["step"], {"replies": 0, "in_format": 0})
        for ok in c["format_ok"]:
            out["replies"] += 1
            out["replies_in_format"] += int(ok)
            t["replies"] += 1
            t["in_format"] += int(ok)
    return out


class Study:
    """One kind of results folder and, where it runs, the study that writes it (docs/layout.md, "Adding a study"): its
    settings, roles and prompts, how it loads and solves a case, its scorers, and what the tools over results need
    (its comparison, its authors' released runs, its report tables). Its ``name`` is the name its declaration gives
    its command (experiments/core/registry.py): the kind its results folders carry."""

    name: ClassVar[str] = ""
    formerly: ClassVar[tuple[str, ...]] = ()  # older names of its folders' kind (set by the registry): read, and resumed, as its own
    settings_cls: ClassVar[type[RunSettings]] = RunSettings
    roles: ClassVar[tuple[str, ...]] = ("default",)
    primary_role: ClassVar[str] = "default"
    prompts: ClassVar[PromptSet | None] = None
    # `medstack sweep`: the roles the swept model plays (empty: ``primary_role``); every other role stays one
    # model, named once, for every run of the sweep (the papers' arrangement). A role in ``role_follows`` that
    # the user does not name takes the model of the role it follows (CRAFT-MD: the summarizer, the grader's).
    sweep_roles: ClassVar[tuple[str, ...]] = ()
    role_follows: ClassVar[dict[str, str]] = {}
    # `--sample N`: the case fields whose values define the strata a sample keeps in proportion (experiments/core/scope.py)
    strata: ClassVar[tuple[str, ...]] = ()
    case_noun: ClassVar[str] = "cases"  # what the runner selects, in summary.md's scope line
    unit_noun: ClassVar[str] = "cases"  # what ``expand`` makes of them, counted by a dry run's plan and `sweep status` (CRAFT-MD: case-trials)
    scorers: ClassVar[tuple[Scorer, ...]] = ()  # its judges and checks (experiments/core/scorers.py), run after solve
    # effects its paper reports relative to a baseline run (experiments/core/conditions.py Effect): compare and the
    # report compute each where the baseline run is among the runs they show
    effects: ClassVar[tuple] = ()
    # `--dry-run`: per role, the replies that stand in for the model's, the k-th request of a role in a case answered with
    # the k-th (the last repeats), or a function of the request's text; chosen so that a dry run walks every branch
    # the study takes on a reply (an empty reply where a role has none)
    standins: ClassVar[dict[str, tuple[str, ...] | Callable[[str], str]]] = {}
    tables: ClassVar[tuple] = ()  # where its paper tables are declared (set by the registry: experiments/tables)
    published: ClassVar[tuple[str, ...]] = ()  # data set names of the authors' released runs (import_published reads one)
    runner_scale: ClassVar[Callable | None] = None  # (case_trials, trials, role ref) -> (study, settings): `bench --runner-scale`
    scope: dict | None = None  # set by the runner: which cases this run takes (all, the first N, a sample) and their composition

    @property
    def judge_roles(self) -> tuple[str, ...]:
        """The roles that grade the answers of the model under test: a run where one of them is that model says so."""
        return tuple(dict.fromkeys(s.role for s in self.scorers if s.role))

    def scorers_for(self, settings: RunSettings) -> list[Scorer]:
        """The scorers a run with these settings runs: those that apply, and the optional ones it names (``scorers``)."""
        chosen = set(getattr(settings, "scorers", None) or ())
        return [s for s in self.scorers if s.decide is not None and s.applies(settings) and (not s.optional or s.name in chosen)]

    def upgrade(self, record: dict, settings) -> dict:
        """A record written in an older shape (records_schema 1 or 2), or imported, in today's typed shape with its
        typed scores (experiments/core/record.py); ``settings``: the folder's config.yaml as this study's settings
        (results.settings_of). The default: the record as it is."""
        return record

    def expand(self, cases: list, settings: RunSettings) -> list[dict]:
        """The units of work of the cases a run takes (CRAFT-MD: one per case and trial); each has a unique ``id``."""
        return cases

    def compare(self, run_dirs: list[str], out: Path) -> dict | None:
        """Its own comparison of several of its runs, written into ``out`` (summary.md first); None: none of its own."""
        return None

    def import_published(self, name: str, dest: Path, cases: str | None) -> Any:
        """One of its ``published`` data sets (the authors' released runs) imported as a results folder at ``dest``."""
        raise NotImplementedError(f"{self.name} has no released runs to import")

    def report_run(self, run: dict) -> list[dict]:
        """Tables of its own the report shows for a run: ``[{"heading", "title", "columns", "rows"}]``."""
        return []

    def fixed_roles(self, settings: RunSettings) -> tuple[str, ...]:
        """The roles besides the swept ones that a run with these settings calls: a sweep refuses to start
        while one of them is not named (it would silently fall back to the config's default model)."""
        return ()

    def default_config(self, overrides: dict) -> Path | None:
        """The YAML file used without --config (the paper setting); ``overrides`` are the study options given."""
        return None

    def prepare(self, settings: RunSettings) -> RunSettings:
        """Fill study defaults and check cross-field rules before anything runs (raise ConfigError)."""
        return settings

    def load_cases(self, settings: RunSettings) -> list[dict]:
        """Every case of the data set; the runner takes --limit / --sample of them and expands them into units."""
        raise NotImplementedError

    async def setup(self, client: LLMClient, settings: RunSettings, cases: list[dict], out: Path) -> None:
        """Optional work once per run after the client is open (e.g. a judge's worked examples)."""

    async def solve(self, ctx: CaseContext, case: dict, settings: RunSettings) -> dict:
        """One unit of work -> its typed record without scores (experiments/core/record.py)."""
        raise NotImplementedError

    def metrics(self, records: list[dict], settings: RunSettings) -> dict:
        """The study's own figures beyond its scorers' (which the runner adds under ``scores``)."""
        return {}

    def worst_case(self, settings: RunSettings, case: dict):
        """One unit of work (an ``expand``-ed case) at its protocol's limit under these settings: an
        :class:`experiments.core.plan.WorstCase` (the turn budget's requests, every reply at its max_tokens, per role the
        longest request), or None (not declared). The runner warns before the first request when a role's longest
        exceeds its model's context; a dry run plans the full run from it (experiments/core/plan.py)."""
        return None

    def typical(self, settings: RunSettings):
        """A unit as a real run measured it (:class:`experiments.core.plan.Typical`), where the study has such a
        measurement; None: a dry run plans from the worst case, or from ``--plan-from RUN``."""
        return None

    def describe(self, settings: RunSettings) -> list[str]:
        """Lines saying how the study builds its requests under these settings (printed by --dry-run)."""
        return []

    def summary(self, metrics: dict, settings: RunSettings, run) -> str:
        raise NotImplementedError
