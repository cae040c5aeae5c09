#!/usr/bin/env bash
# Runs the Gemma/OLMo design study (README.md in this folder): `keel compare` over sweep.toml,
# resumably, then the report into report/. Extra arguments go to keel compare (e.g. --report-only).
exec bash "$(dirname "$0")/../run_sweep.sh" gemma_olmo_designs "$@"
