"""CRAFT-MD prompt templates (files in prompts/, ``$placeholder`` syntax; see experiments/core/prompts.py)."""

from pathlib import Path

from experiments.core.prompts import PromptSet

PROMPTS = PromptSet(Path(__file__).with_name("prompts"))
render = PROMPTS.render
QUESTIONS = ("Q1", "Q2", "Q3", "grounded", "complete")  # the conversation assessor's questions (assess.py), one template each
TEMPLATES = {q: f"assess_{q.lower()}" for q in QUESTIONS}
