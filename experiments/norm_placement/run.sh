#!/usr/bin/env bash
# Runs the norm_placement study (README.md in this folder): `keel compare` over sweep.toml, then over
# followup.toml (same run folder; its four baselines are sweep.toml's runs), resumably, with the
# reports into report/ and report_followup/. Extra arguments go to keel compare (e.g. --report-only).
set -euo pipefail
here="$(dirname "$0")"
bash "$here/../run_sweep.sh" norm_placement "$@"
SWEEP=followup.toml exec bash "$here/../run_sweep.sh" norm_placement "$@"
