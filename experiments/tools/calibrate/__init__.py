"""`medstack calibrate`: LLM judges against clinicians' ratings (docs/protocols.md, Judge calibration and Auto-evaluation). ``run`` computes, ``cli`` declares the commands."""
