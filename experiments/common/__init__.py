"""The one home for pure scoring helpers shared by studies (README.md here states the rule).

- ``parsing``: tags, marked lines, JSON, lists, numbers, ratings and verdicts in model replies;
- ``choice``: the one multiple-choice mapper (reply -> choice; CRAFT-MD and DERA);
- ``grade``: typed views of a graded answer, read by the studies' metrics;
- ``stats``: bootstrap CIs, paired tests, Holm, McNemar, agreement, P/R/F1;
- ``text``: text-similarity metrics (BERTScore with a local encoder, BLEU, ROUGE).

Rule: functions of text and numbers only. No client, no model calls, no run state, no results written;
nothing here imports a study, the runner or serving. The one read is ``text`` loading a local encoder.
"""
