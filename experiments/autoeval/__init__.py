"""Rubric auto-evaluation of dialogues (AMIE-style self-CoT judge, docs/protocols.md, Auto-evaluation)."""
