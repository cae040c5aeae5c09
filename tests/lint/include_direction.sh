#!/bin/sh
# The rooms of src/keel depend one way (README "Layout", /docs design): core includes only core;
# kernels only core and kernels; data and report never reach nn/, train/, cli/, optim/, arch/ or
# io/model_dir.hpp (which builds models); io never reaches train/ or cli/. Prints one line per
# offending include and fails; silent and passing when every room keeps to its side.
# Usage: include_direction.sh SOURCE_DIR
set -u
src="${1:?usage: include_direction.sh SOURCE_DIR}/src/keel"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# offenders ROOM EXTENDED-REGEX WHY: include lines of ROOM whose path matches the regex.
offenders() {
  grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"keel/' "$src/$1" |
    grep -E "$2" |
    sed -E "s|^$src/|src/keel/|; s|^([^:]*:[0-9]+):.*\"(keel/[^\"]*)\".*|\1: includes \2 ($3)|" >>"$out"
}
# allowed_only ROOM ALLOWED-REGEX WHY: include lines of ROOM whose path does not match.
allowed_only() {
  grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"keel/' "$src/$1" |
    grep -vE "$2" |
    sed -E "s|^$src/|src/keel/|; s|^([^:]*:[0-9]+):.*\"(keel/[^\"]*)\".*|\1: includes \2 ($3)|" >>"$out"
}

allowed_only core '"keel/core/' 'core/ includes only core/'
allowed_only kernels '"keel/(core|kernels)/' 'kernels/ includes only core/ and kernels/'
for room in data report; do
  offenders "$room" '"keel/(nn|train|cli|optim|arch)/|"keel/io/model_dir\.hpp"' \
    "$room/ never reaches nn/, train/, cli/, optim/, arch/ or io/model_dir.hpp"
done
offenders io '"keel/(train|cli)/' 'io/ never reaches train/ or cli/'

if [ -s "$out" ]; then
  echo "include direction: $(wc -l <"$out") include(s) against the direction of the rooms:"
  cat "$out"
  exit 1
fi
echo "include direction: every room keeps to its side"
