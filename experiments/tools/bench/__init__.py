"""Serving benchmark: vLLM's endpoint against a plain transformers generate loop (`medstack bench`)."""
