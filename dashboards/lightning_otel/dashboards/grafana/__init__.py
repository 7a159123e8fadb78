"""Grafana provisioning for the trace store: datasource, dashboards and the SQL behind each panel.

Layout (docs/grafana.md):
  panels/<dashboard>/<NN-name>.sql   one query per panel, with a header naming its title and visualization
  dashboards/<dashboard>.json        generated from the SQL files by build.py (never edited by hand)
  provisioning/                      what Grafana reads at start: the DuckDB datasource and a file provider

The datasource is the MotherDuck DuckDB plugin over a views file written by `lightning-otel grafana-views`.
Stdlib only: the CLI imports this package to register its subcommand.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
PANELS_DIR = ROOT / "panels"
DASHBOARDS_DIR = ROOT / "dashboards"
PROVISIONING_DIR = ROOT / "provisioning"

PLUGIN_ID = "motherduck-duckdb-datasource"
# The dashboards reference the datasource by this uid; the provisioning file pins it.
DATASOURCE_UID = "lightning-otel-duckdb"
