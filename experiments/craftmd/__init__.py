"""CRAFT-MD: conversational diagnostic evaluation (Johri et al., Nat Med 2025). See README.md."""

# The study commands study.py registers, as `medstack --help` lists them before study.py is imported (start-up stays
# light: experiments/core/registry.py declared()); the only copy of each command's first help paragraph and place.
COMMANDS = {
    'craftmd': 'CRAFT-MD: simulated doctor–patient conversations, summaries, MCQ/FRQ in 4 formats, two-step grading, N trials.',
    'meld': 'MELD contamination check: first half of each vignette -> model writes the second half; similarity = 1 − normalized Levenshtein.',
}
TOP_LEVEL = ('meld',)  # `medstack NAME` rather than `medstack run NAME`
