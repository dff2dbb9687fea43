# shellcheck shell=bash
# Make sure .venv exists and has cardfence installed with its dev extras. Sourced, not run.
# Reinstalls only when pyproject.toml changed since the last install.
cardfence_venv() {
  local root stamp want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "venv.sh: creating .venv" >&2
    "${PYTHON:-python3}" -m venv "$root/.venv"
    "$root/.venv/bin/python" -m pip install -q --upgrade pip
  fi
  stamp="$root/.venv/.cardfence-installed"
  want=$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "venv.sh: installing cardfence[dev] into .venv" >&2
    "$root/.venv/bin/python" -m pip install -q -e "$root[dev]"
    echo "$want" >"$stamp"
  fi
  export PATH="$root/.venv/bin:$PATH"
}
