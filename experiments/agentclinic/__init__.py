"""AgentClinic: a simulated clinic of doctor, patient, measurement and moderator agents (Schmidgall et al.)."""

# The study command study.py registers, as `medstack --help` lists it before study.py is imported.
COMMANDS = {
    'agentclinic': 'AgentClinic: a doctor agent questions a patient agent and requests tests within a budget of N inferences; a moderator grades its diagnosis.',
}
TOP_LEVEL = ()
