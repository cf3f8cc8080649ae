"""Entry points: the `medstack` CLI, setup and reproduction scripts."""
