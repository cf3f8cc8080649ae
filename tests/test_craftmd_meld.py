"""MELD pieces: halves, truncation and similarity = 1 - normalized Levenshtein (hand-worked)."""

from experiments.craftmd.meld import meld_metrics, similarity, split_halves, truncate_words


def test_split_and_truncate():
    assert split_halves("a b c d e") == ("a b", "c d e")
    assert truncate_words("one two three four", 2) == "one two"


def test_similarity_hand_worked():
    assert similarity("kitten", "kitten") == 1.0
    # kitten -> sitting: 3 edits, longer string 7 characters -> 1 - 3/7
    assert abs(similarity("kitten", "sitting") - (1 - 3 / 7)) < 1e-12
    assert similarity("", "abc") == 0.0


def test_meld_metrics_share_at_threshold():
    recs = [{"similarity": s} for s in (0.2, 0.95, 0.99, 0.5)]
    m = meld_metrics(recs, 0.95)
    assert m["n"] == 4 and m["share_ge_threshold"] == 0.5 and m["max_similarity"] == 0.99
    assert abs(m["mean_similarity"] - 0.66) < 1e-12
