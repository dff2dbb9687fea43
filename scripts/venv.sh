# shellcheck shell=bash
# Make sure .venv exists and has cardfence installed with its dev extras. Sourced, not run.
#
# The interpreter is $PYTHON, else python3; it must be Python >= 3.11, checked before anything is
# created. A .venv is reused only when its last install finished (a stamp holds the hash of the
# pyproject.toml it installed): a .venv without the stamp, or made by an older Python, is removed
# and made anew, and a failed install removes the .venv it was filling, so a later run never
# builds on a broken one. Reinstalls only when pyproject.toml changed since the last install.

cardfence_python_ok() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

cardfence_venv() {
  local root stamp want python
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  stamp="$root/.venv/.cardfence-installed"
  python="${PYTHON:-python3}"
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "venv.sh: no interpreter '$python': cardfence needs Python >= 3.11 (set PYTHON=/path/to/python3.11 or newer)" >&2
    return 1
  fi
  if ! cardfence_python_ok "$python"; then
    echo "venv.sh: $python is Python $("$python" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?'): cardfence needs Python >= 3.11 (set PYTHON=/path/to/python3.11 or newer); nothing was created" >&2
    return 1
  fi
  if [ -d "$root/.venv" ] && { [ ! -f "$stamp" ] || ! cardfence_python_ok "$root/.venv/bin/python"; }; then
    echo "venv.sh: .venv is incomplete or too old: making it anew" >&2
    rm -rf "$root/.venv"
  fi
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "venv.sh: creating .venv with $python" >&2
    if ! "$python" -m venv "$root/.venv" || ! "$root/.venv/bin/python" -m pip install -q --upgrade pip; then
      rm -rf "$root/.venv"
      echo "venv.sh: could not create .venv with $python; nothing is left behind" >&2
      return 1
    fi
  fi
  want=$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "venv.sh: installing cardfence[dev] into .venv" >&2
    if ! "$root/.venv/bin/python" -m pip install -q -e "$root[dev]"; then
      rm -rf "$root/.venv"
      echo "venv.sh: installing cardfence[dev] failed; .venv was removed so the next run starts clean" >&2
      return 1
    fi
    echo "$want" >"$stamp"
  fi
  export PATH="$root/.venv/bin:$PATH"
}
