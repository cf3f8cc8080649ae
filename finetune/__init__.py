"""LoRA supervised fine-tuning of the MediTOD baselines."""
