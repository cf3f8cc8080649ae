"""DERA (Dialog-Enabled Resolving Agents, Nair et al. 2023): Researcher/Decider dialogues for
medical conversation summarization, care plans, the corruption study, and open-ended MedQA. See README.md."""

from experiments.core.registry import Command, StudyDeclaration

EXIT = "    Exit 0 done, 2 bad input (nothing started), 3 some cases failed (run the same command again to retry them)."

# everything this folder adds to medstack (experiments/core/registry.py): read by `medstack --help` without importing study.py;
# `formerly`: the kind older demo configs wrote into config.yaml (`experiment: dera-qa-demo`), resumed as the command's
STUDY = StudyDeclaration(
    commands=(
        Command("dera-summarize", "DERA summarization (docs/protocols.md, DERA): initial summary, Researcher/Decider dialogue with a scratchpad "
                "(<= 15 turns), final rewrite; GPT-F1 of DERA vs initial.", "study:SummarizeStudy", more=EXIT,
                formerly=("dera-summarize-demo",)),
        Command("dera-careplan", "DERA care plans (docs/protocols.md, DERA): one-shot initial plan, Researcher/Decider dialogue with a "
                "scratchpad (<= 15 turns), final rewrite.", "study:CareplanStudy", more=EXIT),
        Command("dera-corrupt", "Corruption study (docs/protocols.md, DERA): write reference summaries, corrupt them at --level, run DERA from "
                "the corrupted version, and score both against the reference with GPT-F1 per section. Default --out: "
                "runs/dera-corrupt-<model>-level<L>.", "study:CorruptStudy", more=EXIT, formerly=("dera-corrupt-demo",)),
        Command("dera-qa", "The 1-shot self-consistency baseline and DERA on the same MedQA questions, in one run (docs/protocols.md, DERA).",
                "study:QAStudy", more="""    --data: MedQA open-ended JSONL (question_open, answer, options, answer_idx) or a folder with <split>.jsonl;
    default: the shipped 5-question sample. Default --out: runs/dera-qa-<model>[-mcq].

""" + EXIT, formerly=("dera-qa-demo",)),
    ),
    tables="paper_tables.yaml", adapter="paper_values:ADAPTER",
)
