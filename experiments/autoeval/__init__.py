"""Rubric auto-evaluation of dialogues (AMIE-style self-CoT judge, docs/protocols.md, Auto-evaluation)."""

# The study commands study.py registers, as `medstack --help` lists them before study.py is imported (start-up stays
# light: experiments/core/registry.py declared()); the only copy of each command's first help paragraph and place.
COMMANDS = {
    'autoeval': 'Rate every stored doctor-patient dialogue 1-5 per rubric criterion with a self-CoT LLM judge (AMIE style).',
}
TOP_LEVEL = ('autoeval',)  # `medstack NAME` rather than `medstack run NAME`
