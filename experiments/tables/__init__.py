"""Paper tables: each study's headline tables in the paper's layout, beside the published values (README.md)."""
