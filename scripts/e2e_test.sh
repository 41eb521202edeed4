#!/usr/bin/env bash
# End-to-end tests of `peng serve` with the official openai client (tests/e2e, pytest).
# Creates the virtual environment .venv-e2e on first use (tests/e2e/requirements.txt), then
# runs `pytest tests/e2e -q` with any extra arguments and exits with pytest's status, except
# that "no tests collected" (5) counts as a failure.
# PENG_BIN (default build/tools/peng) is the binary under test; PENG_E2E_MODEL the model.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

venv=.venv-e2e
if [[ ! -x $venv/bin/pytest ]] || ! cmp -s tests/e2e/requirements.txt $venv/.requirements; then
  python3 -m venv "$venv" || exit 1
  "$venv/bin/pip" install -q -r tests/e2e/requirements.txt || exit 1
  cp tests/e2e/requirements.txt "$venv/.requirements"
fi

export PENG_BIN=${PENG_BIN:-$PWD/build/tools/peng}
if [[ ! -x $PENG_BIN ]]; then
  echo "e2e_test.sh: $PENG_BIN not found; build the peng target first (scripts/build.sh)" >&2
  exit 1
fi

"$venv/bin/python" -m pytest tests/e2e -q "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "e2e_test.sh: no tests collected" >&2
  exit 1
fi
exit $rc
