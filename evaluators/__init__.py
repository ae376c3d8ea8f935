"""Evaluation: SQL metric vectors, statistics and reports (installed as ``trajlake.evaluators``).

- ``*.sql``: the documented DuckDB queries over the lake's views (per-episode metrics, tool-call latency, pairs,
  failure taxonomy, diagnosis facts); :mod:`.sql` loads and parameterises them.
- :mod:`.stats`: task-clustered estimates, paired tests, cluster bootstrap, pass@k, power.
- :mod:`.data` (run the SQL, fetch arrays), :mod:`.metrics` (metric vector, paired comparison), :mod:`.report`
  (``build_report``: the JSON contract of docs/eval.md), :mod:`.diagnose` (regression decision tree),
  :mod:`.render` and :mod:`.svg` (terminal, Markdown, self-contained HTML).
"""
