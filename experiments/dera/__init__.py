"""DERA (Dialog-Enabled Resolving Agents, Nair et al. 2023): Researcher/Decider dialogues for
medical conversation summarization, care plans, the corruption study, and open-ended MedQA.

Modules: ``settings`` (YAML -> pydantic), ``data`` (encounters, MedQA), ``prompts`` (template
files + hashes), ``calls`` (one model call, logged), ``dialogue`` (summaries/care plans/corruption),
``qa`` (MedQA protocol), ``gptf1`` and ``qa_metrics`` (scores), ``report`` (metrics + summary.md),
``cli`` (the ``medstack run dera-*`` commands).
"""

# The study commands study.py registers, as `medstack --help` lists them before study.py is imported (start-up stays
# light: experiments/core/registry.py declared()); the only copy of each command's first help paragraph and place.
COMMANDS = {
    'dera-summarize': 'DERA summarization (docs/protocols.md, DERA): initial summary, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite; GPT-F1 of DERA vs initial.',
    'dera-careplan': 'DERA care plans (docs/protocols.md, DERA): one-shot initial plan, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite.',
    'dera-corrupt': 'Corruption study (docs/protocols.md, DERA): write reference summaries, corrupt them at --level, run DERA from the corrupted version, and score both against the reference with GPT-F1 per section. Default --out: runs/dera-corrupt-<model>-level<L>.',
    'dera-qa': 'The 1-shot self-consistency baseline and DERA on the same MedQA questions, in one run (docs/protocols.md, DERA).',
}
TOP_LEVEL = ()  # `medstack NAME` rather than `medstack run NAME`
