#!/bin/sh
# Every keel::Error names its file, or the command-line argument its input came from: a throw
# with an empty file (Error("", ...), Error(std::string(), ...), Error({}, ...)) is listed, one
# line per offender, and fails the test.
# Usage: error_names_file.sh SOURCE_DIR
set -u
root="${1:?usage: error_names_file.sh SOURCE_DIR}"
cd "$root" || exit 2
hits=$(grep -rnE 'Error\([[:space:]]*(""|std::string\(\)|std::string\{\}|\{\})[[:space:]]*,' src |
  sed -E 's/^([^:]*:[0-9]+):[[:space:]]*/\1: /')
if [ -n "$hits" ]; then
  echo "keel::Error without a file: $(printf '%s\n' "$hits" | wc -l) throw(s); name the file or the CLI argument:"
  printf '%s\n' "$hits"
  exit 1
fi
echo "every keel::Error names its file or argument"
