"""Agent protocols (DERA, CRAFT-MD, MediTOD, rubric auto-evaluation), metrics, statistics and run handling."""
