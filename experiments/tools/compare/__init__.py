"""`medstack compare`: several runs of any study side by side."""
