#!/usr/bin/env bash
# A real Kafka broker for tests and by hand: scripts/kafka.sh start|stop|status
#
# start [--keep]
#   Fetches Kafka's pinned jars (scripts/jvm_deps.py kafka-tools; WEIR_KAFKA_HOME names a
#   Kafka install to use instead) and starts one KRaft node (broker and controller in one
#   JVM, `kafka.Kafka`) in the background, on free 127.0.0.1 ports. Returns once the
#   broker answers a metadata request and prints its bootstrap address
#   `127.0.0.1:PORT` (listener PLAINTEXT) as its last line; fails after
#   WEIR_KAFKA_START_TIMEOUT seconds (default 120) with the log's tail.
#   --keep starts it on the data and ports of the last start (a restart: the topics,
#   their records and the transaction state are kept); without it the data is formatted
#   afresh.
# stop    stops it (SIGTERM: a controlled shutdown; SIGKILL after 30 s) and waits until it
#         is gone. `stop --kill` kills it at once (SIGKILL), as a crash would.
# status  prints "running 127.0.0.1:PORT sasl 127.0.0.1:PORT pid N" (exit 0) or
#         "stopped" (exit 3).
#
# Listeners (all on 127.0.0.1):
#   PLAINTEXT      the bootstrap address printed; its clients are User:ANONYMOUS, a super
#                  user (the broker itself talks to itself there)
#   SASL_PLAINTEXT SASL/PLAIN with two users, admin (password admin-secret, a super user)
#                  and alice (alice-secret), for the authentication and authorization tests;
#                  its address is in $WEIR_KAFKA_DIR/sasl_bootstrap
#   SSL            TLS with a certificate for 127.0.0.1 from a CA made at each fresh
#                  format (scripts/kafka_tls.py: $WEIR_KAFKA_DIR/tls/ca.pem, and a client
#                  certificate client.pem/client.key that the broker verifies when one is
#                  presented, ssl.client.auth=requested); its address is in
#                  $WEIR_KAFKA_DIR/ssl_bootstrap
# Authorization: KRaft's StandardAuthorizer; a resource without ACLs is open to everyone
# (allow.everyone.if.no.acl.found), so only ACLs a test adds deny anything.
# Topics are never created by a produce (auto.create.topics.enable=false); the internal
# topics have one partition and replica each (one node, fast to start); a transaction past
# its timeout is aborted within a second (the tests of the sink's transaction timeout);
# the log cleaner looks for work every second, not 15 (the compaction tests).
#
# State lives in WEIR_KAFKA_DIR (default var/kafka): pid, bootstrap, sasl_bootstrap,
# ssl_bootstrap, server.properties, kafka.log, data/, tls/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/common.sh"  # state_dir, pid_of, terminate
dir=$(state_dir WEIR_KAFKA_DIR "$root/var/kafka")
pidfile=$dir/pid
bootstrapfile=$dir/bootstrap
saslfile=$dir/sasl_bootstrap
sslfile=$dir/ssl_bootstrap
tls=$dir/tls
config=$dir/server.properties
log=$dir/kafka.log
# The small helpers (free ports, the cluster id, the readiness probe) run on the venv's
# Python when there is one (scripts/bootstrap.sh makes it), else on the system's.
py=python3
[ -x "$root/.venv/bin/python" ] && py=$root/.venv/bin/python
command -v "$py" >/dev/null || { echo "weir: scripts/kafka.sh needs python3 (or .venv)" >&2; exit 1; }

running_pid() { pid_of "$pidfile" kafka.Kafka; }

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

classpath() {
  if [ -n "${WEIR_KAFKA_HOME:-}" ]; then
    ls "$WEIR_KAFKA_HOME"/libs/kafka_2.13-*.jar >/dev/null 2>&1 \
      || { echo "weir: WEIR_KAFKA_HOME=$WEIR_KAFKA_HOME has no libs/kafka_2.13-*.jar" >&2; return 1; }
    echo "$WEIR_KAFKA_HOME/libs/*"
  else
    local lib
    lib=$("$py" "$root/scripts/jvm_deps.py" kafka-tools | tail -n 1) || return 1
    echo "$lib/*"
  fi
}

write_config() {
  local port=$1 sasl_port=$2 ssl_port=$3 controller_port=$4
  cat >"$config" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sasl_port,SSL://127.0.0.1:$ssl_port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sasl_port,SSL://127.0.0.1:$ssl_port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$tls/server.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$tls/ca.pem
listener.name.ssl.ssl.client.auth=requested
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=true
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.ms=-1
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
log.cleaner.backoff.ms=1000
EOF
}

# Format fresh storage under new free ports.
format() {
  rm -rf "$dir/data" "$tls"
  if ! "$py" "$root/scripts/kafka_tls.py" "$tls"; then
    echo "weir: could not make the TLS listener's certificates (scripts/kafka_tls.py needs" \
         "the cryptography package: scripts/bootstrap.sh installs it in .venv)" >&2
    return 1
  fi
  write_config "$(free_port)" "$(free_port)" "$(free_port)" "$(free_port)"
  if ! "${java_cmd[@]}" kafka.tools.StorageTool format \
      -t "$("$py" -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22])')" \
      -c "$config" >"$dir/format.log" 2>&1; then
    cat "$dir/format.log" >&2
    echo "weir: could not format Kafka's storage in $dir/data" >&2
    return 1
  fi
}

# Start the broker on $config; 0 once it answers on $port, 1 when it exited first, 2 when
# it did not answer within WEIR_KAFKA_START_TIMEOUT seconds.
launch() {
  rm -f "$bootstrapfile" "$saslfile" "$sslfile" "$pidfile"
  # setsid: the broker outlives this script and a Ctrl-C in its terminal.
  setsid "${java_cmd[@]}" kafka.Kafka "$config" >>"$log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$pidfile"
  local timeout=${WEIR_KAFKA_START_TIMEOUT:-120} waited=0
  until broker_answers "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pidfile"
      return 1
    fi
    [ "$waited" -ge $((timeout * 5)) ] && return 2
    sleep 0.2
    waited=$((waited + 1))
  done
  echo "weir: Kafka up (pid $pid, data and log under $dir; SASL/PLAIN on" \
       "127.0.0.1:$sasl_port, TLS on 127.0.0.1:$ssl_port)" >&2
}

start() {
  local keep=""
  [ "${1:-}" = --keep ] && keep=yes
  if pid=$(running_pid); then
    echo "weir: Kafka already running (pid $pid); scripts/kafka.sh stop first" >&2
    cat "$bootstrapfile"
    return 0
  fi
  command -v java >/dev/null || { echo "weir: scripts/kafka.sh needs Java 17 on PATH" >&2; return 1; }
  local cp port sasl_port ssl_port
  cp=$(classpath)
  java_cmd=(java -Xmx512m -Dlog4j.configuration="file:$root/scripts/jvm/kafka-tools/log4j.properties" -cp "$cp")
  local attempt status
  for attempt in 1 2 3; do
    if [ -z "$keep" ] || [ ! -f "$config" ] || [ ! -d "$dir/data" ]; then
      format || return 1
    fi
    port=$(listener_port PLAINTEXT)
    sasl_port=$(listener_port SASL_PLAINTEXT)
    ssl_port=$(listener_port SSL)
    status=0
    launch || status=$?
    [ "$status" -eq 0 ] && break
    # A free port taken by another process between our pick and the broker's bind: pick
    # again (a fresh start only; --keep must keep its ports).
    if [ "$status" -eq 1 ] && [ -z "$keep" ] && [ "$attempt" -lt 3 ] \
        && grep -q "Address already in use" "$log"; then
      echo "weir: a port was taken meanwhile; starting Kafka again on others" >&2
      continue
    fi
    tail -n 30 "$log" >&2
    if [ "$status" -eq 1 ]; then
      echo "weir: Kafka exited before it was up (log: $log)" >&2
    else
      echo "weir: Kafka not up after ${WEIR_KAFKA_START_TIMEOUT:-120}s (log: $log); stopping it" >&2
      stop >/dev/null
    fi
    return 1
  done
  echo "127.0.0.1:$sasl_port" >"$saslfile"
  echo "127.0.0.1:$ssl_port" >"$sslfile"
  echo "127.0.0.1:$port" >"$bootstrapfile"
  echo "127.0.0.1:$port"
}

# listener_port NAME: the port of listener NAME in $config's advertised.listeners.
listener_port() {
  sed -n "s|^advertised.listeners=\(.*,\)\{0,1\}$1://127.0.0.1:\([0-9]*\).*|\2|p" "$config"
}

# Exit 0 when the broker on 127.0.0.1:$1 answers an ApiVersions request with a broker
# registered (a listening port alone is not a broker that takes produce requests).
broker_answers() {
  "$py" - "$1" <<'EOF' 2>/dev/null
import socket, struct, sys
# ApiVersions v0 (api key 18), correlation id 1, client id "weir"
request = struct.pack(">hhih", 18, 0, 1, 4) + b"weir"
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
    s.sendall(struct.pack(">i", len(request)) + request)
    size = struct.unpack(">i", s.recv(4))[0]
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        if not chunk:
            sys.exit(1)
        data += chunk
    correlation, error = struct.unpack(">ih", data[:6])
    sys.exit(0 if correlation == 1 and error == 0 else 1)
EOF
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$pidfile" "$bootstrapfile" "$saslfile" "$sslfile"
    echo "stopped"
    return 0
  fi
  if [ "${1:-}" = --kill ]; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  else
    terminate "$pid" Kafka
  fi
  rm -f "$pidfile" "$bootstrapfile" "$saslfile" "$sslfile"
  echo "stopped"
}

status() {
  local pid
  if pid=$(running_pid); then
    echo "running $(cat "$bootstrapfile" 2>/dev/null || echo "(starting)") sasl $(cat "$saslfile" 2>/dev/null || echo "-") ssl $(cat "$sslfile" 2>/dev/null || echo "-") pid $pid"
  else
    echo "stopped"
    return 3
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  start) start "$@" ;;
  stop) stop "$@" ;;
  status) status ;;
  *) echo "usage: scripts/kafka.sh start [--keep] | stop [--kill] | status" >&2; exit 2 ;;
esac
