"""DERA (Dialog-Enabled Resolving Agents, Nair et al. 2023): Researcher/Decider dialogues for
medical conversation summarization, care plans, the corruption study, and open-ended MedQA.

Modules: ``settings`` (YAML -> pydantic), ``data`` (encounters, MedQA), ``prompts`` (template
files + hashes), ``calls`` (one model call, logged), ``dialogue`` (summaries/care plans/corruption),
``qa`` (MedQA protocol), ``gptf1`` and ``qa_metrics`` (scores), ``report`` (metrics + summary.md),
``cli`` (the ``medstack run dera-*`` commands).
"""
