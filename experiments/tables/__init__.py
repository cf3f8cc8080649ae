"""Paper tables: each study's headline tables in the paper's layout, beside the published values.

``declare`` reads ``experiments/<study>/paper_tables.yaml``; ``build`` computes (values, CIs,
published, paired tests with Holm); ``render`` prints (summary.md, `compare`, the report);
``plots`` draws the figures.
"""
