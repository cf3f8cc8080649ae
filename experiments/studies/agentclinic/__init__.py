"""AgentClinic: a simulated clinic of doctor, patient, measurement and moderator agents (Schmidgall et al.)."""

from experiments.core.registry import Command, StudyDeclaration

# everything this folder adds to medstack (experiments/core/registry.py): read by `medstack --help` without importing study.py
STUDY = StudyDeclaration(
    commands=(Command("agentclinic", "AgentClinic: a doctor agent questions a patient agent and requests tests within a budget of N "
                      "inferences; a moderator grades its diagnosis.", "study:AgentClinicStudy", more="""
    One record per OSCE case. Writes records.jsonl, metrics.json, summary.md in --out.
    Exit 0 done, 2 bad input, 3 some cases failed (run the same command again to retry them).
    """),),
    tables="paper_tables.yaml", adapter="paper_values:ADAPTER",
)
