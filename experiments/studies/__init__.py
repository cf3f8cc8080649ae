"""The studies: one folder each (docs/layout.md)."""
