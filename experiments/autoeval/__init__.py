"""Rubric auto-evaluation of dialogues (AMIE-style self-CoT judge, SPEC 3.1)."""
