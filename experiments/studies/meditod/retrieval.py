"""Exemplar retrieval for the in-context baselines: embed each sample's retrieval key (its last-turn
text, test and training side alike: ``tasks.py``), L2-normalise, take the top k by inner product,
most similar first (the authors' bge-large-en-v1.5 CLS vector; any local sentence-transformers directory may
stand in, by default ``experiments.common.text.default_encoder_path()``). Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np


def load_encoder(path: str | None = None):
    from sentence_transformers import SentenceTransformer

    from experiments.common.text import default_encoder_path
    from models.paths import set_offline

    set_offline()
    return SentenceTransformer(path or default_encoder_path(), device="cpu")


def embed(encoder, texts: list[str], batch_size: int = 32) -> np.ndarray:
    if not texts:
        return np.zeros((0, 1), dtype=np.float32)
    return np.asarray(encoder.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                                      show_progress_bar=False), dtype=np.float32)


def top_k(queries: np.ndarray, pool: np.ndarray, k: int, exclude: list[set[int]] | None = None) -> list[list[int]]:
    """Indices of the ``k`` pool rows with the largest inner product per query, best first.

    Ties keep the lower index first. ``exclude[i]`` lists pool rows query ``i`` may not use
    (e.g. turns of its own dialogue when retrieving from the split being evaluated).
    """
    if k <= 0 or len(pool) == 0:
        return [[] for _ in range(len(queries))]
    scores = queries @ pool.T
    out = []
    for i, row in enumerate(scores):
        order = np.argsort(-row, kind="stable")
        banned = exclude[i] if exclude else set()
        out.append([int(j) for j in order if int(j) not in banned][:k])
    return out


def retrieve_exemplars(test_samples: list[dict], train_samples: list[dict], k: int, encoder) -> list[list[dict]]:
    """For each test sample, the ``k`` training samples with the closest last turn, most similar first (never its own dialogue)."""
    if k <= 0 or not train_samples:
        return [[] for _ in test_samples]
    pool = embed(encoder, [s["retrieval_text"] for s in train_samples])
    queries = embed(encoder, [s["retrieval_text"] for s in test_samples])
    by_dialog: dict[str, set[int]] = {}
    for j, s in enumerate(train_samples):
        by_dialog.setdefault(s["dialog_id"], set()).add(j)
    exclude = [by_dialog.get(s["dialog_id"], set()) for s in test_samples]
    return [[train_samples[j] for j in idx] for idx in top_k(queries, pool, k, exclude)]
