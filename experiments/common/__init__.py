"""Helpers shared by studies and metrics: ``stats`` (bootstrap CIs, paired tests, Holm, McNemar,
agreement) and ``parsing`` (tags, marked lines and JSON in model output)."""
