"""Which of a study's cases a run takes, said with its results: all, the first N (``--limit``), or a random sample of
N stratified like the whole set (``--sample N``, the run's ``--seed``): docs/running-studies.md, "Which cases".

Ties among the largest remainders go to the larger stratum, then by name; the ranking by sha256(seed, case id)
gives the same cases on every machine and Python version, so a resumed run finds its own cases.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Iterable

from experiments.core.config import ConfigError


def stratum(item: Any, keys: Iterable[str]) -> tuple[str, ...]:
    """The values of ``keys`` for one case (a dict or an object)."""
    get = item.get if isinstance(item, dict) else lambda k: getattr(item, k, None)
    return tuple(str(get(k) if get(k) not in (None, "") else "unknown") for k in keys)


def _ident(item: Any, at: int) -> str:
    if isinstance(item, dict):
        return str(item.get("id", item.get("case_id", at)))
    return str(getattr(item, "id", at))


def allocate(sizes: dict[tuple, int], n: int) -> dict[tuple, int]:
    """Stratum -> cases drawn from it: proportional to its size, largest remainder (see the module docstring)."""
    total = sum(sizes.values())
    quota = {s: n * k / total for s, k in sizes.items()}
    out = {s: int(q) for s, q in quota.items()}
    order = sorted(sizes, key=lambda s: (-(quota[s] - out[s]), -sizes[s], s))
    for s in order[: n - sum(out.values())]:
        out[s] += 1
    return out


def stratified_sample(items: list, n: int, seed: int, keys: tuple[str, ...] = ()) -> list:
    """``n`` of ``items`` stratified by ``keys`` (all of them when ``n`` >= their number), in their input order."""
    if n >= len(items):
        return list(items)
    groups: dict[tuple, list[int]] = {}
    for at, item in enumerate(items):
        groups.setdefault(stratum(item, keys), []).append(at)
    rank = lambda at: hashlib.sha256(f"{seed}:{_ident(items[at], at)}".encode()).hexdigest()  # noqa: E731
    chosen: set[int] = set()
    for s, k in allocate({s: len(g) for s, g in groups.items()}, n).items():
        chosen.update(sorted(groups[s], key=rank)[:k])
    return [items[at] for at in sorted(chosen)]


def composition(items: list, keys: tuple[str, ...]) -> dict[str, int]:
    """Cases per value of the first stratum key (CRAFT-MD: per dataset), largest first."""
    if not keys:
        return {}
    return dict(Counter(stratum(i, keys[:1])[0] for i in items).most_common())


def check_scope(s) -> None:
    """--limit and --sample together are refused (before any data is read)."""
    if getattr(s, "limit", None) is not None and getattr(s, "sample", None) is not None:
        raise ConfigError("--limit takes the first N cases and --sample a stratified random sample: give one of them")


def take(items: list, s, keys: tuple[str, ...] = ()) -> tuple[list, dict]:
    """(the cases a run with settings ``s`` takes, its scope): ``s.sample`` (stratified by ``keys``, seed ``s.seed``),
    ``s.limit`` (the first N) or all. Giving both is refused."""
    check_scope(s)
    limit, sample = getattr(s, "limit", None), getattr(s, "sample", None)
    if sample is not None:
        chosen, how = stratified_sample(items, sample, s.seed, keys), "sample"
    elif limit is not None:
        chosen, how = list(items[:limit]), "first"
    else:
        chosen, how = list(items), "all"
    scope = {"how": how, "n": len(chosen), "of": len(items), "strata": list(keys),
             **({"seed": s.seed, "strata_count": len({stratum(i, keys) for i in items})} if how == "sample" else {}),
             "composition": composition(chosen, keys), "whole": composition(items, keys)}
    asked = sample if sample is not None else limit
    if asked is not None and asked > len(items):  # taken whole: said, not silently clamped
        scope["note"] = f"--{how if how == 'sample' else 'limit'} {asked:,} is more than the {len(items):,} cases of the data: all {len(items):,} are taken"
    return chosen, scope


def counts_text(c: dict[str, int]) -> str:
    """'90 MedQA_USMLE, 5 dermatology_public, 5 dermatology_private'."""
    return ", ".join(f"{n:,} {k}" for k, n in c.items())


def scope_line(scope: dict | None, noun: str = "cases") -> str:
    """'cases: 100 of 2,004, a random sample stratified by dataset and specialty (...): 90 MedQA_USMLE, ...'."""
    if not scope:
        return ""
    n, of, keys = scope["n"], scope["of"], scope.get("strata") or []
    parts = " and ".join(keys)
    if scope["how"] == "sample" and n < of:
        text = (f"{noun}: {n:,} of {of:,}, a random sample" + (f" stratified by {parts} ({scope.get('strata_count')} strata, "
                "each in proportion to the whole set" if keys else " (") + f"; --sample {n} --seed {scope['seed']})")
    elif scope["how"] == "first" and n < of:
        text = f"{noun}: the first {n:,} of {of:,} in the input's order (--limit {n}: not a sample)"
    else:
        text = f"{noun}: all {of:,}"
    text += f": {counts_text(scope['composition'])}" if scope.get("composition") else ""
    if n < of and scope.get("whole"):
        text += f" (the whole set: {counts_text(scope['whole'])})"
    return text
