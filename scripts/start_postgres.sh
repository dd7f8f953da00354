#!/usr/bin/env bash
# Start a local PostgreSQL for agentforge's store tests; safe to run again (every step is idempotent).
#
# Installs the Debian package if missing, starts a cluster listening on 127.0.0.1:5432, creates the
# role and database agentforge/agentforge (password agentforge, CREATEDB so tests can make a fresh
# database per session) and prints the SQLAlchemy URL as its last line:
#
#   export AGENTFORGE_TEST_PG_URL="$(scripts/start_postgres.sh | tail -n 1)"
#
# Needs root (apt-get, su postgres). Port: PGPORT (default 5432).
set -euo pipefail

PORT="${PGPORT:-5432}"
USER_NAME=agentforge
PASSWORD=agentforge
DB_NAME=agentforge

log() { echo "[start_postgres] $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    log "installing postgresql (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
fi

PG_VERSION="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
BIN="/usr/lib/postgresql/${PG_VERSION}/bin"

as_postgres() { su postgres -s /bin/bash -c "$*"; }

if command -v pg_lsclusters >/dev/null 2>&1; then
    # Debian wrapper: one cluster "main" per version.
    if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "${PG_VERSION} main"; then
        log "creating cluster ${PG_VERSION}/main on port ${PORT}"
        pg_createcluster "${PG_VERSION}" main --port="${PORT}" >&2
    fi
    CONF="/etc/postgresql/${PG_VERSION}/main/postgresql.conf"
    sed -i -E "s/^#?listen_addresses\s*=.*/listen_addresses = '127.0.0.1'/" "${CONF}"
    sed -i -E "s/^#?port\s*=.*/port = ${PORT}/" "${CONF}"
    if ! pg_lsclusters -h | awk -v v="${PG_VERSION}" '$1==v && $2=="main" {print $4}' | grep -q online; then
        log "starting cluster ${PG_VERSION}/main"
        pg_ctlcluster "${PG_VERSION}" main start >&2
    fi
else
    DATA=/var/lib/postgresql/agentforge-data
    if [ ! -s "${DATA}/PG_VERSION" ]; then
        log "initdb ${DATA}"
        mkdir -p "${DATA}" && chown postgres:postgres "${DATA}"
        as_postgres "${BIN}/initdb -D ${DATA} --auth-local=trust --auth-host=scram-sha-256 -U postgres" >&2
    fi
    if ! as_postgres "${BIN}/pg_ctl -D ${DATA} status" >/dev/null 2>&1; then
        as_postgres "${BIN}/pg_ctl -D ${DATA} -l ${DATA}/server.log -w -o \"-c listen_addresses=127.0.0.1 -p ${PORT}\" start" >&2
    fi
fi

for _ in $(seq 1 30); do
    if as_postgres "${BIN}/pg_isready -q -h 127.0.0.1 -p ${PORT}" || \
       as_postgres "${BIN}/pg_isready -q -p ${PORT}"; then
        break
    fi
    sleep 1
done

psql_admin() { as_postgres "psql -p ${PORT} -v ON_ERROR_STOP=1 -qAt -c \"$1\""; }

if [ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname='${USER_NAME}'")" != "1" ]; then
    log "creating role ${USER_NAME}"
    psql_admin "CREATE ROLE ${USER_NAME} LOGIN CREATEDB PASSWORD '${PASSWORD}'" >&2
else
    psql_admin "ALTER ROLE ${USER_NAME} LOGIN CREATEDB PASSWORD '${PASSWORD}'" >&2
fi
if [ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname='${DB_NAME}'")" != "1" ]; then
    log "creating database ${DB_NAME}"
    psql_admin "CREATE DATABASE ${DB_NAME} OWNER ${USER_NAME}" >&2
fi

echo "postgresql+psycopg://${USER_NAME}:${PASSWORD}@127.0.0.1:${PORT}/${DB_NAME}"
