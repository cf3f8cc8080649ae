"""Tools over any study and its results folders; they name no study (docs/layout.md)."""
