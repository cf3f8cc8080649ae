"""CRAFT-MD prompt templates (files in prompts/, ``$placeholder`` syntax; see experiments/core/prompts.py)."""

from pathlib import Path

from experiments.core.prompts import PromptSet

PROMPTS = PromptSet(Path(__file__).with_name("prompts"))
render = PROMPTS.render
