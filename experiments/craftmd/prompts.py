"""CRAFT-MD prompt templates (files in prompts/, ``$placeholder`` syntax; see experiments/prompts.py)."""

from pathlib import Path

from experiments.prompts import PromptSet

PROMPTS = PromptSet(Path(__file__).with_name("prompts"))
render = PROMPTS.render
