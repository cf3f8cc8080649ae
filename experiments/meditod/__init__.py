"""MediTOD (Saley et al., 2024): NLU, POL and NLG baselines with the dataset authors' metrics."""
