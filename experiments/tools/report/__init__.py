"""One self-contained offline HTML report over results directories (`medstack report`)."""
