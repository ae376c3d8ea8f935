"""Evaluation: SQL metric vectors, statistics and reports (installed as ``trajlake.evaluators``)."""
