"""Model registry and preparation of local weights."""
