#!/usr/bin/env bash
# Runs the lr_width study (README.md in this folder): `keel compare` over sweep.toml, resumably, then
# the report into report/. Extra arguments go to keel compare (e.g. --report-only).
exec bash "$(dirname "$0")/../run_sweep.sh" lr_width "$@"
