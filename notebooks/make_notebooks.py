"""Write the notebooks (run once after editing; the .ipynb files are committed without outputs).

    python notebooks/make_notebooks.py

Each notebook reads the lake named by $TRAJLAKE_LAKE (default ./lake); `trajlake demo` makes one.
tests/test_notebooks.py executes them with nbclient on a small generated lake and checks their outputs.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

EXPLORE = [
    new_markdown_cell("# Exploring a trajlake lake with SQL (DuckDB) and Polars\n\n"
                      "The lake is a set of Delta tables; `trajlake.connect` gives an in-process DuckDB connection "
                      "with one view per table (committed episodes only), `trajlake.scan` a Polars LazyFrame. "
                      "Run `trajlake demo` first, or point `TRAJLAKE_LAKE` at your lake."),
    new_code_cell("import os\nimport trajlake\n\nlake = trajlake.open_lake(os.environ.get('TRAJLAKE_LAKE', 'lake'))\n"
                  "con = trajlake.connect(lake)\nprint('versions read:', trajlake.lake_versions(con))"),
    new_markdown_cell("## Runs at a glance"),
    new_code_cell("runs = con.sql('''\n  select run_id, count(*) as episodes, round(avg(success::int), 3) as success_rate,\n"
                  "         round(avg(n_turns), 1) as mean_turns, round(sum(cost_usd), 4) as cost_usd\n"
                  "  from episodes group by run_id order by run_id''').pl()\nprint(runs)"),
    new_markdown_cell("## Token-level data: what the trainer learns from\n\nThe loss mask is 1 only on tokens the "
                      "policy produced; observations, system and user text are 0."),
    new_code_cell("mask = con.sql('''\n  select actor, count(*) as turns, sum(len(token_ids)) as tokens,\n"
                  "         sum(list_sum(loss_mask)) as trainable_tokens\n"
                  "  from turns group by actor order by actor''').pl()\nprint(mask)\n"
                  "assert mask.filter(mask['actor'] != 'policy')['trainable_tokens'].sum() == 0"),
    new_markdown_cell("## The same with Polars (lazy: nothing is loaded until `collect`)"),
    new_code_cell("import polars as pl\n\nlat = (trajlake.scan(lake, 'turns')\n       .filter(pl.col('actor') == 'env')\n"
                  "       .group_by('run_id')\n       .agg(pl.col('latency_ms').quantile(0.5).alias('p50_ms'),\n"
                  "            pl.col('latency_ms').quantile(0.99).alias('p99_ms'), pl.len().alias('tool_calls'))\n"
                  "       .sort('run_id')\n       .collect())\nprint(lat)"),
    new_markdown_cell("## Failures by error class and termination reason"),
    new_code_cell("print(con.sql('''\n  select run_id, coalesce(error_class, '-') as error_class, termination_reason, count(*) as n\n"
                  "  from episodes where not success group by all order by run_id, n desc''').pl())"),
    new_markdown_cell("## Time travel: pin a read to table versions\n\nEvery read can be pinned; "
                      "`trajlake info` prints the current versions."),
    new_code_cell("pinned = trajlake.connect(lake, as_of={t: 0 for t in trajlake.TABLES})\n"
                  "print('episodes at version 0:', pinned.sql('select count(*) from episodes').fetchone()[0])"),
]

COMPARE = [
    new_markdown_cell("# Comparing two runs with `trajlake eval`\n\nA paired comparison: episodes are matched on "
                      "(task, seed, attempt); every difference carries a task-clustered confidence interval, "
                      "p-values are Holm-corrected across the metric vector."),
    new_code_cell("import json, os, subprocess, sys\n\nLAKE = os.environ.get('TRAJLAKE_LAKE', 'lake')\n"
                  "BASELINE = os.environ.get('BASELINE', 'demo-B0')\nCANDIDATE = os.environ.get('CANDIDATE', 'demo-R1')\n"
                  "out = subprocess.run([sys.executable, '-m', 'trajlake', '--lake', LAKE, 'eval', '--baseline', BASELINE,\n"
                  "                      '--candidate', CANDIDATE, '--format', 'json', '--resamples', '500'],\n"
                  "                     capture_output=True, text=True, check=True).stdout\nreport = json.loads(out)\n"
                  "print('lake versions:', report['lake_versions'])\nprint('pairs:', report['comparison']['n_pairs'])"),
    new_markdown_cell("## The metric vector of each run, with intervals"),
    new_code_cell("names = ['success', 'steps', 'cost_per_success', 'recovery_rate', 'episode_latency_p50',\n"
                  "         'episode_latency_p99', 'tool_latency_p50', 'tool_latency_p99', 'duplicate_rate']\n"
                  "for run in (BASELINE, CANDIDATE):\n    m = report['runs'][run]['metrics']\n"
                  "    print(run, {n: None if m[n]['estimate'] is None else round(m[n]['estimate'], 3) for n in names})"),
    new_markdown_cell("## Paired differences (candidate minus baseline)"),
    new_code_cell("cmp = report['comparison']['metrics']\nfor n in names:\n    d = cmp.get(n)\n    if d and d['diff'] is not None:\n"
                  "        print(f\"{n:22s} diff {d['diff']:+.3f}  CI [{d['ci_low']}, {d['ci_high']}]  p_holm {d['p_holm']}\")"),
    new_markdown_cell("## Plot: success with 95% intervals"),
    new_code_cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n\nfig, ax = plt.subplots(figsize=(5, 3))\n"
                  "for i, run in enumerate((BASELINE, CANDIDATE)):\n    s = report['runs'][run]['metrics']['success']\n"
                  "    ax.errorbar([i], [s['estimate']], yerr=[[s['estimate'] - s['ci_low']], [s['ci_high'] - s['estimate']]],\n"
                  "                fmt='o', capsize=6)\nax.set_xticks([0, 1], [BASELINE, CANDIDATE])\nax.set_ylabel('success (pass@1)')\n"
                  "fig.tight_layout()\nfig.savefig(os.environ.get('PLOT_OUT', 'success.png'))\nprint('plotted')"),
]


def main() -> None:
    for name, cells in (("01_explore_lake.ipynb", EXPLORE), ("02_compare_runs.ipynb", COMPARE)):
        nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                "language": "python"}})
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    main()
