"""Metrics as pure functions. Text-similarity metrics shared by several studies live in ``text``."""
