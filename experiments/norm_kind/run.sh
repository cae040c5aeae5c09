#!/usr/bin/env bash
# Runs the norm_kind study (README.md in this folder): `keel compare` over sweep.toml, resumably, then
# the report into report/. Extra arguments go to keel compare (e.g. --report-only).
exec bash "$(dirname "$0")/../run_sweep.sh" norm_kind "$@"
