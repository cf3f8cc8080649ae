"""`medstack rescore`: a finished run's judge asked again by another model or a panel. ``run`` computes, ``cli`` declares the command."""
