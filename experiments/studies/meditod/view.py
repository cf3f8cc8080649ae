"""The MediTOD data set at a glance: split sizes, utterances, intent / slot / action distributions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from experiments.studies.meditod.data import load_dialogs, load_split_ids, split_path


def _split_names(splits_dir: Path) -> list[str]:
    names = [p.name[: -len("_ids.json")] for p in sorted(splits_dir.glob("*_ids.json"))]
    order = {"train": 0, "valid": 1, "test": 2}
    return sorted(names, key=lambda n: (order.get(n, 3), n))


def dataset_stats(data: str | Path, splits_dir: str | Path | None = None) -> dict:
    data = Path(data)
    dialogs = load_dialogs(data)
    sdir = Path(splits_dir) if splits_dir else data.parent
    splits = {name: load_split_ids(sdir, name, dialogs=dialogs) for name in _split_names(sdir)}
    rows = {}
    for name, ids in {**splits, "all": list(dialogs)}.items():
        utts = [u for d in ids for u in dialogs[d]["utterances"]]
        rows[name] = {
            "dialogues": len(ids), "utterances": len(utts),
            "patient_turns": sum(u["speaker"] == "patient" for u in utts),
            "doctor_turns": sum(u["speaker"] == "doctor" for u in utts),
            "avg_utterances_per_dialogue": round(len(utts) / len(ids), 1) if ids else 0.0,
        }
    intents, slots, actions, action_slots = Counter(), Counter(), Counter(), Counter()
    for d in dialogs.values():
        for u in d["utterances"]:
            for e in u.get("nlu", []):
                intents[e["intent"]] += 1
                for slot, items in (e.get("slots") or {}).items():
                    slots[slot] += len(items) if isinstance(items, list) else 1
            for a in u.get("actions", []):
                actions[a["action"]] += 1
                for slot, items in a.items():
                    if slot != "action":
                        action_slots[slot] += len(items) if isinstance(items, list) else 1
    return {"data": str(data), "splits_dir": str(sdir), "splits": rows,
            "intents": dict(intents.most_common()), "slots": dict(slots.most_common()),
            "actions": dict(actions.most_common()), "action_slots": dict(action_slots.most_common()),
            "split_files": {n: str(split_path(sdir, n)) for n in splits}}


def print_stats(stats: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table("split", "dialogues", "utterances", "patient turns", "doctor turns", "utterances / dialogue", title=f"MediTOD: {stats['data']}")
    for name, r in stats["splits"].items():
        t.add_row(name, str(r["dialogues"]), str(r["utterances"]), str(r["patient_turns"]), str(r["doctor_turns"]), str(r["avg_utterances_per_dialogue"]))
    con.print(t)
    for key, title in (("intents", "patient intents"), ("slots", "NLU slots (items)"), ("actions", "doctor actions"), ("action_slots", "action slots (items)")):
        tt = Table(title, "count", "share")
        total = sum(stats[key].values()) or 1
        for name, n in stats[key].items():
            tt.add_row(name, str(n), f"{100 * n / total:.1f}%")
        con.print(tt)


def write_png(stats: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 6))
    for ax, key, title in zip(axes, ("slots", "intents", "actions"), ("NLU slots", "patient intents", "doctor actions")):
        items = list(stats[key].items())[:20][::-1]
        ax.barh([k for k, _ in items], [v for _, v in items], color="#4c72b0")
        ax.set_title(title)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle(f"MediTOD label distributions ({stats['splits']['all']['dialogues']} dialogues)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
