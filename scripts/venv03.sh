# shellcheck shell=bash
# Make sure .venv-a2a03 exists with the official a2a-sdk of the 0.3 protocol generation, for the
# 0.3 test agent (tests/support/agent03/server.py, run as a subprocess by tests/support/peer03.py).
# a2a-sdk 0.3 and 1.3 cannot share a venv, hence this second one. Sourced (scripts/test calls
# cardfence_venv03) or run (`bash scripts/venv03.sh` prints the venv's folder on stdout).
#
# The interpreter is $PYTHON, else python3 (the one .venv is made with). The venv is reused only
# when its last install finished: a stamp holds the interpreter's version and the requirements it
# installed, and a venv without the stamp, or stamped for other requirements or another
# interpreter, is removed and made anew; a failed install removes the venv it was filling.
# Sourcing exports CARDFENCE_A2A03_VENV (tests/support/peer03.py honours it).

CARDFENCE_A2A03_REQUIREMENTS=("a2a-sdk[http-server]==0.3.26" "uvicorn>=0.30,<1")

cardfence_venv03() {
  local root venv stamp want python
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv="$root/.venv-a2a03"
  stamp="$venv/.cardfence-installed"
  python="${PYTHON:-python3}"
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "venv03.sh: no interpreter '$python' (set PYTHON=/path/to/python3)" >&2
    return 1
  fi
  if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
    echo "venv03.sh: $python is older than Python 3.10, which a2a-sdk 0.3 needs; nothing was created" >&2
    return 1
  fi
  want="$("$python" -c 'import platform; print(platform.python_version())') ${CARDFENCE_A2A03_REQUIREMENTS[*]}"
  if [ -d "$venv" ] && { [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; }; then
    echo "venv03.sh: .venv-a2a03 is incomplete or for other requirements: making it anew" >&2
    rm -rf "$venv"
  fi
  if [ ! -f "$stamp" ]; then
    echo "venv03.sh: creating .venv-a2a03 with $python: ${CARDFENCE_A2A03_REQUIREMENTS[*]}" >&2
    if ! "$python" -m venv "$venv" \
      || ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${CARDFENCE_A2A03_REQUIREMENTS[@]}"; then
      rm -rf "$venv"
      echo "venv03.sh: installing a2a-sdk 0.3 failed; .venv-a2a03 was removed so the next run starts clean" >&2
      return 1
    fi
    echo "$want" >"$stamp"
  fi
  export CARDFENCE_A2A03_VENV="$venv"
  echo "venv03.sh: a2a-sdk 0.3 agent venv: $venv" >&2
}

# Run rather than sourced: make the venv and print its folder.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cardfence_venv03
  echo "$CARDFENCE_A2A03_VENV"
fi
