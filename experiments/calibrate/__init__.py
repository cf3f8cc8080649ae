"""`medstack calibrate`: LLM judges against clinicians' ratings (SPEC 3.1, 3.2). ``run`` computes, ``cli`` declares the commands."""
