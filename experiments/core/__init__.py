"""The study runner and its parts, shared by every study: ``study`` (the Study interface, CaseContext),
``runner`` (the one runner), ``commands`` (study flags generated from settings, command bodies), ``config``
(run settings), ``results`` (results directories), ``prompts`` and ``constraints`` (prompt templates,
structured-output constraints), ``registry`` (the studies, registered by their study.py),
``concurrency``, ``dryrun``, ``recordwriter``, ``runlock``."""
