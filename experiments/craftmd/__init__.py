"""CRAFT-MD: conversational diagnostic evaluation (Johri et al., Nat Med 2025). See README.md."""
