#!/usr/bin/env bash
# Runs the bf16_residual study (README.md in this folder): `keel compare` over sweep.toml, resumably, then
# the report into report/. Extra arguments go to keel compare (e.g. --report-only).
exec bash "$(dirname "$0")/../run_sweep.sh" bf16_residual "$@"
