"""MediTOD (Saley et al., 2024): NLU, POL and NLG baselines with the dataset authors' metrics."""

# The study commands study.py registers, as `medstack --help` lists them before study.py is imported (start-up stays
# light: experiments/core/registry.py declared()); the only copy of each command's first help paragraph and place.
COMMANDS = {
    'meditod-nlu': "MediTOD NLU: dialog history + last turn -> the patient turn's intents/slots (JSON); P/R/F1, joint accuracy.",
    'meditod-pol': "MediTOD POL: dialog state + last turn -> the doctor's next actions (JSON); P/R/F1, Precision@K.",
    'meditod-nlg': "MediTOD NLG: doctor actions + last turn -> the doctor's utterance; BLEU-2/4, ROUGE-1/L, BERTScore.",
}
TOP_LEVEL = ()  # `medstack NAME` rather than `medstack run NAME`
