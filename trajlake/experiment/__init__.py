"""``trajlake experiment``: the §8 project as one command (docs/experiment.md).

:func:`run_experiment` trains and evaluates the arms B0-R3 of a config for every training seed into one lake,
resumably; :func:`report_experiment` writes the bundle (summary.json with the preregistered hypotheses' verdicts,
report.md/html, model card, contamination, unrun list, failure browser, replayed trajectories)."""

from trajlake.experiment.bundle import report_experiment
from trajlake.experiment.config import ExperimentConfig, load_experiment
from trajlake.experiment.run import run_experiment

__all__ = ["ExperimentConfig", "load_experiment", "report_experiment", "run_experiment"]
