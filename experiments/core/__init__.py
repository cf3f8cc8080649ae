"""The study runner and its parts, shared by every study: ``study`` (the Study interface, CaseContext),
``runner`` (the one runner), ``commands`` (common command-line options, command bodies), ``config``
(run settings), ``results`` (results directories), ``prompts`` and ``constraints`` (prompt templates,
structured-output constraints), ``registry`` (which study commands plug into `medstack`),
``concurrency``, ``dryrun``, ``recordwriter``, ``runlock``."""
