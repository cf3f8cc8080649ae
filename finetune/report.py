"""Training metrics out of the Trainer's log history: ``train_metrics.json`` and ``loss.png``."""

from __future__ import annotations

import json
from pathlib import Path


def curves(log_history: list[dict]) -> dict:
    train = [{"step": h["step"], "loss": h["loss"], "lr": h.get("learning_rate"), "tokens_per_s": h.get("tokens_per_s")}
             for h in log_history if "loss" in h]
    valid_by_step = {h["step"]: h["eval_loss"] for h in log_history if "eval_loss" in h}  # the final evaluate() repeats a step
    valid = [{"step": s, "loss": v} for s, v in sorted(valid_by_step.items())]
    return {"train": train, "valid": valid}


def summarize(log_history: list[dict], tokens: int, train_seconds: float, wall_seconds: float | None = None) -> dict:
    """Curves plus headline numbers; ``tokens``/``train_seconds`` exclude evaluation and checkpoint time."""
    c = curves(log_history)
    losses = [p["loss"] for p in c["train"]]
    k = max(1, len(losses) // 4)  # first/last quarter means: robust to noisy single steps
    return {
        **c,
        "steps": c["train"][-1]["step"] if c["train"] else 0,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "first_quarter_mean_loss": sum(losses[:k]) / k if losses else None,
        "last_quarter_mean_loss": sum(losses[-k:]) / k if losses else None,
        "best_valid_loss": min((p["loss"] for p in c["valid"]), default=None),
        "train_tokens": int(tokens),
        "train_seconds": round(train_seconds, 2),
        "train_tokens_per_s": round(tokens / train_seconds, 2) if train_seconds > 0 else None,
        "wall_seconds": round(wall_seconds, 2) if wall_seconds is not None else None,
    }


def write_metrics(out: Path, metrics: dict) -> Path:
    path = Path(out) / "train_metrics.json"
    path.write_text(json.dumps(metrics, indent=2, default=str))
    return path


def loss_figure_png(metrics: dict, title: str | None = None) -> bytes | None:
    """Train and valid loss against the optimizer step, the best checkpoint (lowest valid loss) marked; PNG bytes."""
    if not metrics.get("train"):
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([p["step"] for p in metrics["train"]], [p["loss"] for p in metrics["train"]], label="train", marker=".")
    if metrics.get("valid"):
        ax.plot([p["step"] for p in metrics["valid"]], [p["loss"] for p in metrics["valid"]], label="valid", marker="o")
        best = min(metrics["valid"], key=lambda p: p["loss"])
        step = metrics.get("best_step") or best["step"]
        ax.axvline(step, color="#555", linestyle=":", linewidth=1)
        ax.plot([best["step"]], [best["loss"]], marker="*", markersize=14, color="#c44e52", linestyle="none",
                label=f"best checkpoint (step {step}, valid {best['loss']:.3f})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title(title or f"{metrics.get('base', '?')} LoRA, MediTOD {metrics.get('task', '?')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def plot_losses(out: Path, metrics: dict, title: str) -> Path | None:
    """loss.png: :func:`loss_figure_png` written beside the adapter; None when nothing was logged."""
    png = loss_figure_png(metrics, title)
    if png is None:
        return None
    path = Path(out) / "loss.png"
    path.write_bytes(png)
    return path
