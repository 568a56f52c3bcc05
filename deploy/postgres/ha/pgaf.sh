#!/bin/sh
# Sets up a pg_auto_failover formation for jetinbox on hosts with Debian's
# packages (postgresql-15, postgresql-15-auto-failover, pg-auto-failover-cli,
# pgbouncer): one monitor and two data nodes, a primary and a synchronous
# standby. Run as the postgres user, one step per host:
#
#   pgaf.sh monitor   on the monitor host, once
#   pgaf.sh node      on each data node, the first one first; start each
#                     host's `pg_autoctl run` (see below) before the next step
#   pgaf.sh roles     once, on the primary, after both nodes run: jetinbox's
#                     roles (../roles.sql) and their passwords
#   pgaf.sh userlist  on each data node, after `roles`: PgBouncer's auth file
#
# Each step creates and configures; it runs nothing for good. What keeps a
# node running is `pg_autoctl run --pgdata "$PGDATA"` under the service
# manager (`pg_autoctl show systemd --pgdata "$PGDATA"` prints a unit).
#
# Settings, from the environment:
#   PGDATA                   the data directory to create (required)
#   PGPORT                   the PostgreSQL port (5432)
#   PGAF_HOSTNAME            the name the other hosts reach this one by
#                            (hostname -f); it must match the certificate
#   PGAF_LISTEN              listen_addresses ('*')
#   PGAF_NAME                the node's name in the formation (node step)
#   PGAF_MONITOR_HOST, PGAF_MONITOR_PORT   the monitor (node step; port 5432)
#   PGAF_CLIENTS             the client network allowed to the jetinbox
#                            database, a pg_hba.conf address (samenet)
#   PGAF_SECRETS             a directory of password files, one per role,
#                            NAME.password: autoctl_node and
#                            pgautofailover_replicator (the formation's own
#                            logins), and for the roles step the five
#                            jetinbox_* roles (required)
#   PGAF_SSL_CA_FILE, PGAF_SSL_CERT, PGAF_SSL_KEY   the CA and this host's
#                            certificate and key: every connection is then
#                            verify-full. Unset: pg_autoctl's self-signed
#                            certificates, encrypted but unauthenticated
#                            (sslmode=require), for a trial only.
#   PGAF_SQL_DIR             where roles.sql and postgresql.conf.snippet are
#                            (this script's ../)
#
# Passwords go into the postgres user's password file ($PGPASSFILE, else
# ~/.pgpass): pg_autoctl, pg_basebackup and the standby's replication
# connection all read it, and none lands in a command line or a config file.
set -eu

die() { echo "pgaf.sh: $*" >&2; exit 1; }
usage() { echo "usage: pgaf.sh monitor|node|roles|userlist" >&2; exit 2; }

[ $# -eq 1 ] || usage
: "${PGDATA:?PGDATA must name the data directory}"
: "${PGAF_SECRETS:?PGAF_SECRETS must name the directory of password files}"
PGPORT=${PGPORT:-5432}
PGAF_HOSTNAME=${PGAF_HOSTNAME:-$(hostname -f)}
PGAF_LISTEN=${PGAF_LISTEN:-*}
PGAF_CLIENTS=${PGAF_CLIENTS:-samenet}
PGAF_SQL_DIR=${PGAF_SQL_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
PGPASSFILE=${PGPASSFILE:-$HOME/.pgpass}
export PGDATA PGPORT PGPASSFILE

if [ -n "${PGAF_SSL_CA_FILE:-}" ]; then
	: "${PGAF_SSL_CERT:?PGAF_SSL_CERT must go with PGAF_SSL_CA_FILE}"
	: "${PGAF_SSL_KEY:?PGAF_SSL_KEY must go with PGAF_SSL_CA_FILE}"
	# pg_autoctl's connections to the monitor verify it against the CA too.
	sslmode="verify-full&sslrootcert=$PGAF_SSL_CA_FILE"
	set -- "$1" --ssl-ca-file "$PGAF_SSL_CA_FILE" --server-cert "$PGAF_SSL_CERT" --server-key "$PGAF_SSL_KEY" --ssl-mode verify-full
else
	sslmode=require
	set -- "$1" --ssl-self-signed
fi

password() {
	[ -r "$PGAF_SECRETS/$1.password" ] || die "no password file $PGAF_SECRETS/$1.password"
	# Read with the trailing newline dropped; : and \ are escaped for pgpass.
	sed -e 's/\\/\\\\/g' -e 's/:/\\:/g' "$PGAF_SECRETS/$1.password" | head -n 1
}

# pgpass_add HOST PORT DB USER: one line for USER's password, once.
pgpass_add() {
	line="$1:$2:$3:$4:$(password "$4")"
	touch "$PGPASSFILE"
	chmod 0600 "$PGPASSFILE"
	grep -qxF "$line" "$PGPASSFILE" || printf '%s\n' "$line" >>"$PGPASSFILE"
}

# set_password DB ROLE: ROLE's password from its file, over the local socket.
set_password() {
	pw=$(head -n 1 "$PGAF_SECRETS/$2.password")
	local_psql -d "$1" -v role="$2" -v pw="$pw" <<'SQL'
ALTER ROLE :"role" PASSWORD :'pw';
SQL
}

# The postgres user's own connections: the running server's socket (the
# fifth line of postmaster.pid names its directory), peer authentication.
local_psql() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$(sed -n 5p "$PGDATA/postmaster.pid")" -p "$PGPORT" "$@"; }

# server_up: start PostgreSQL for the step's own SQL, if pg_autoctl left it
# stopped, on a socket in PGDATA and no TCP address; server_down stops what
# server_up started. `pg_autoctl run` starts it for good.
started=
server_up() {
	pg_ctl -D "$PGDATA" status >/dev/null 2>&1 && return 0
	pg_ctl -D "$PGDATA" -w -t 60 -l "$PGDATA/setup.log" \
		-o "-c listen_addresses= -c unix_socket_directories=$PGDATA -p $PGPORT" start >/dev/null
	started=1
}
server_down() {
	if [ -n "$started" ]; then pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null; fi
	started=
}

# tighten_hba: initdb trusts every local connection, by socket or TCP, as
# any role. Drop its lines, keep pg_autoctl's (each marked), and put first:
# the postgres OS user by peer, nothing without TLS.
tighten_hba() {
	{
		echo '# jetinbox: written by pgaf.sh'
		echo 'local all postgres peer'
		echo 'local all all scram-sha-256'
		echo 'hostnossl all all all reject'
		grep 'Auto-generated by pg_auto_failover' "$PGDATA/pg_hba.conf" || true
	} >"$PGDATA/pg_hba.conf.new"
	mv "$PGDATA/pg_hba.conf.new" "$PGDATA/pg_hba.conf"
	chmod 0600 "$PGDATA/pg_hba.conf"
}

step=$1
shift
case $step in
monitor)
	pg_autoctl create monitor --pgdata "$PGDATA" --pgport "$PGPORT" --hostname "$PGAF_HOSTNAME" \
		--auth scram-sha-256 "$@"
	pg_autoctl config set --pgdata "$PGDATA" postgresql.listen_addresses "$PGAF_LISTEN"
	grep -q '^# jetinbox: written by pgaf.sh' "$PGDATA/pg_hba.conf" || tighten_hba
	# The nodes log in as autoctl_node, with this password; so does the
	# monitor's own pg_autoctl, over the local socket.
	pgpass_add '*' "$PGPORT" pg_auto_failover autoctl_node
	server_up
	set_password pg_auto_failover autoctl_node
	server_down
	;;
node)
	: "${PGAF_NAME:?PGAF_NAME must name the node}"
	: "${PGAF_MONITOR_HOST:?PGAF_MONITOR_HOST must name the monitor}"
	PGAF_MONITOR_PORT=${PGAF_MONITOR_PORT:-5432}
	pgpass_add "$PGAF_MONITOR_HOST" "$PGAF_MONITOR_PORT" pg_auto_failover autoctl_node
	# The standby's base backup and replication connection, to whichever
	# node is primary.
	pgpass_add '*' '*' '*' pgautofailover_replicator
	# Synchronous replication: with both data nodes in the write quorum,
	# pg_auto_failover sets synchronous_standby_names on the primary, and
	# each commit waits for the standby. number_sync_standbys stays 0, the
	# only value two data nodes allow: the primary goes on alone
	# (wait_primary) only once the monitor has marked the standby unhealthy,
	# and then it can no longer be promoted, so no acked commit is lost.
	pg_autoctl create postgres --pgdata "$PGDATA" --pgport "$PGPORT" --listen "$PGAF_LISTEN" \
		--hostname "$PGAF_HOSTNAME" --name "$PGAF_NAME" --dbname jetinbox \
		--auth scram-sha-256 --replication-quorum true --candidate-priority 50 \
		--monitor "postgres://autoctl_node@$PGAF_MONITOR_HOST:$PGAF_MONITOR_PORT/pg_auto_failover?sslmode=$sslmode" "$@"
	# jetinbox's settings (timeouts, keepalives, password hashing) after
	# pg_autoctl's; TLS and replication stay as pg_autoctl set them.
	if [ -f "$PGDATA/PG_VERSION" ]; then
		grep -Ev '^[[:space:]]*(ssl|wal_level|max_wal_senders)' "$PGAF_SQL_DIR/postgresql.conf.snippet" >"$PGDATA/jetinbox.conf"
		grep -qxF "include 'jetinbox.conf'" "$PGDATA/postgresql.conf" || echo "include 'jetinbox.conf'" >>"$PGDATA/postgresql.conf"
	fi
	# jetinbox's roles reach its database over TLS with passwords, from the
	# client network only (and the node's own PgBouncer: PGAF_CLIENTS must
	# cover the address it connects from).
	if [ -f "$PGDATA/PG_VERSION" ] && ! grep -q '^# jetinbox: written by pgaf.sh' "$PGDATA/pg_hba.conf"; then
		tighten_hba
		echo "hostssl jetinbox jetinbox_migrator,jetinbox_consumer,jetinbox_relay,jetinbox_verifier,jetinbox_maintainer $PGAF_CLIENTS scram-sha-256" >>"$PGDATA/pg_hba.conf"
	fi
	# On the first node, the primary: the replication login's password,
	# which the standby's base backup and WAL receiver use. (The standby
	# gets it, and the roles, by replication.)
	if [ -f "$PGDATA/PG_VERSION" ]; then
		server_up
		if [ "$(local_psql -d postgres -c 'SELECT pg_is_in_recovery()')" = f ]; then
			set_password postgres pgautofailover_replicator
		fi
		server_down
	fi
	;;
roles)
	[ "$(local_psql -d jetinbox -c 'SELECT pg_is_in_recovery()')" = f ] || die "this node is not the primary; run the roles step there"
	# Roles replicate: the standby has them once the primary commits.
	local_psql -d jetinbox -f "$PGAF_SQL_DIR/roles.sql" >/dev/null
	for role in jetinbox_migrator jetinbox_consumer jetinbox_relay jetinbox_verifier jetinbox_maintainer; do
		set_password jetinbox "$role"
	done
	;;
userlist)
	# PgBouncer's auth file: the roles' SCRAM secrets as the server keeps
	# them. PgBouncer checks clients against them and logs in to the
	# server with them, so it never holds a password.
	local_psql -d jetinbox <<'SQL'
SELECT format('"%s" "%s"', rolname, rolpassword) FROM pg_authid
WHERE rolname LIKE 'jetinbox\_%' AND rolcanlogin AND rolpassword LIKE 'SCRAM-SHA-256$%' ORDER BY rolname;
SQL
	;;
*)
	usage
	;;
esac
