#!/usr/bin/env bash
# Make sure a Docker daemon answers; start one if we can. Idempotent.
#
#   1. `docker info` answers            -> nothing to do (exit 0)
#   2. not root                         -> print what to install/start, exit 1
#   3. root: install docker.io with apt-get when dockerd (or the docker CLI) is
#      missing, start `dockerd` in the background with its log and pid in files,
#      wait (bounded) until `docker info` answers. Exit 0 when it does.
#
# When this script started a daemon it prints, as its last line,
#   SANDBOX_DOCKERD_PID=<pid>
# and writes the pid to $SANDBOX_DOCKERD_PIDFILE, so whoever called it (tests, CI)
# can stop exactly that daemon later:  kill "$(cat "$SANDBOX_DOCKERD_PIDFILE")"
#
# Settings (environment):
#   SANDBOX_DOCKERD_PIDFILE   default /run/sandbox-kernel-dockerd.pid
#   SANDBOX_DOCKERD_LOG       default /var/log/sandbox-kernel-dockerd.log
#   SANDBOX_DOCKERD_WAIT      seconds to wait for the daemon, default 60
#   SANDBOX_DOCKERD_ARGS      extra dockerd arguments (word-split), default none
#   DOCKER_HOST               honoured by `docker info`; a daemon is only started
#                             for the default local socket (or a unix:// socket).
set -euo pipefail

PIDFILE="${SANDBOX_DOCKERD_PIDFILE:-/run/sandbox-kernel-dockerd.pid}"
LOGFILE="${SANDBOX_DOCKERD_LOG:-/var/log/sandbox-kernel-dockerd.log}"
WAIT="${SANDBOX_DOCKERD_WAIT:-60}"
EXTRA_ARGS="${SANDBOX_DOCKERD_ARGS:-}"

say() { printf 'ensure-docker: %s\n' "$*" >&2; }

daemon_answers() {
    command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1
}

if daemon_answers; then
    say "a Docker daemon answers (${DOCKER_HOST:-local socket}); nothing to do"
    exit 0
fi

case "${DOCKER_HOST:-}" in
    "" | unix://*) ;;
    *)
        say "DOCKER_HOST=${DOCKER_HOST} does not answer; it is a remote daemon, which this script does not start"
        exit 1
        ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    say "no Docker daemon answers and this is not root, so nothing can be installed or started."
    say "install the 'docker.io' package (Debian/Ubuntu: sudo apt-get install -y docker.io),"
    say "start the daemon (sudo systemctl start docker, or sudo dockerd &) and add yourself to"
    say "the 'docker' group (sudo usermod -aG docker \"\$USER\", then log in again)."
    exit 1
fi

running_dockerd() {  # pids of dockerd processes on this host, if any
    local p
    for p in /proc/[0-9]*; do
        if [ "$(cat "$p/comm" 2>/dev/null || true)" = "dockerd" ]; then
            printf '%s ' "${p#/proc/}"
        fi
    done
}

wait_for_daemon() {  # $1: pid of the dockerd we watch ("" for none); bounded by WAIT
    local pid="$1" deadline=$((SECONDS + WAIT))
    until daemon_answers; do
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            say "dockerd exited while starting; the end of its log ($LOGFILE):"
            tail -n 20 "$LOGFILE" >&2 || true
            rm -f "$PIDFILE"
            exit 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "the Docker daemon did not answer within ${WAIT}s; see $LOGFILE"
            exit 1
        fi
        sleep 0.5
    done
}

is_our_dockerd() {  # the pid file names a live dockerd (not a reused pid)
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "dockerd" ]
}
# A daemon we started earlier may still be coming up: wait for it, do not start another.
if is_our_dockerd; then
    say "dockerd (pid $(cat "$PIDFILE")) from an earlier run is starting; waiting"
    started_pid=""
else
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
        if ! command -v apt-get >/dev/null 2>&1; then
            say "dockerd is missing and apt-get is not available: install Docker for this system"
            exit 1
        fi
        say "installing docker.io with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq docker.io >/dev/null
    fi
    # The package's init script (or a service manager) may be starting a daemon on
    # the default socket: wait for that one instead of starting a second.
    running="$(running_dockerd)"
    if [ -z "${DOCKER_HOST:-}" ] && [ -n "$running" ]; then
        say "dockerd is already running (pid $running) but not answering yet; waiting for it"
        wait_for_daemon ""
        say "Docker daemon is up"
        exit 0
    fi
    socket_args=()
    if [ -n "${DOCKER_HOST:-}" ]; then
        socket_args=(--host "$DOCKER_HOST")
    fi
    mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOGFILE")"
    say "starting dockerd (log: $LOGFILE)"
    detach=()
    if command -v setsid >/dev/null 2>&1; then
        detach=(setsid)  # its own session: a Ctrl-C aimed at the caller does not reach it
    fi
    # shellcheck disable=SC2086  # EXTRA_ARGS is word-split on purpose
    nohup "${detach[@]}" dockerd "${socket_args[@]}" $EXTRA_ARGS >>"$LOGFILE" 2>&1 </dev/null &
    started_pid=$!
    echo "$started_pid" >"$PIDFILE"
fi

wait_for_daemon "$(cat "$PIDFILE" 2>/dev/null || true)"

say "Docker daemon is up"
if [ -n "${started_pid:-}" ]; then
    echo "SANDBOX_DOCKERD_PID=$started_pid"
fi
