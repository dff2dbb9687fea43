# shellcheck shell=bash
# A private, throw-away PostgreSQL cluster on 127.0.0.1 for the tests. Sourced, not run.
#   pg_start  -> exports CARDFENCE_TEST_PG_URL and CARDFENCE_PG_DIR
#   pg_stop   -> stops the cluster and removes its folder
# PostgreSQL refuses to run as root, so the cluster belongs to the `postgres` user when we are root.

pg_bindir() {
  local dir
  for dir in /usr/lib/postgresql/*/bin "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

pg_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  local bin port dir
  bin=$(pg_bindir) || { echo "pg.sh: no pg_ctl found" >&2; return 1; }
  port=$(pg_free_port)
  dir=$(mktemp -d /tmp/cardfence-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$dir"
  fi
  pg_as_owner "$bin/initdb" -D "$dir/data" --auth=trust --username=cardfence -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; return 1; }
  pg_as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir -c max_connections=200 -c fsync=on -c shared_preload_libraries=pg_stat_statements" \
    >/dev/null || { cat "$dir/server.log" >&2; return 1; }
  pg_as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U cardfence cardfence_test || return 1
  export CARDFENCE_PG_DIR="$dir" CARDFENCE_PG_BIN="$bin"
  export CARDFENCE_TEST_PG_URL="postgresql+psycopg://cardfence@127.0.0.1:$port/cardfence_test"
  echo "pg.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
}

pg_stop() {
  [ -n "${CARDFENCE_PG_DIR:-}" ] || return 0
  pg_as_owner "$CARDFENCE_PG_BIN/pg_ctl" -D "$CARDFENCE_PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$CARDFENCE_PG_DIR"
  unset CARDFENCE_PG_DIR CARDFENCE_TEST_PG_URL
}
