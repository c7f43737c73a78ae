#!/usr/bin/env bash
# A one-node Slurm cluster on localhost for the Slurm integration tests.
#
#   bash tests/slurm/cluster.sh start [--no-install]   install if needed (root + apt), then start
#   bash tests/slurm/cluster.sh stop                   stop the daemons this script started
#   bash tests/slurm/cluster.sh status                 exit 0 when the cluster takes jobs
#
# Everything lives in $METADIST_SLURM_DIR (default /tmp/metadist-slurm); clients find the
# cluster with SLURM_CONF=$METADIST_SLURM_DIR/slurm.conf, so no system configuration is
# touched. `start` is idempotent: with the packages installed and the daemons up it returns
# at once. It works on Debian/Ubuntu without systemd: munged, slurmctld and slurmd are
# started by hand.
set -euo pipefail

DIR="${METADIST_SLURM_DIR:-/tmp/metadist-slurm}"
CONF="$DIR/slurm.conf"
PACKAGES=(slurmctld slurmd slurm-client munge)
export SLURM_CONF="$CONF"

say() { echo "slurm-cluster: $*" >&2; }

have_binaries() {
    local binary
    for binary in slurmctld slurmd sbatch srun scontrol squeue munged munge unmunge; do
        command -v "$binary" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$binary" >/dev/null 2>&1 || return 1
    done
}

install_packages() {
    if have_binaries; then
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        say "Slurm/munge are not installed and installing needs root (apt-get install ${PACKAGES[*]})"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "Slurm/munge are not installed and there is no apt-get to install ${PACKAGES[*]}"
        return 1
    fi
    say "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 600 apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$DIR/apt.log" 2>&1; then
        timeout 300 apt-get update -qq >>"$DIR/apt.log" 2>&1 || true
        if ! timeout 600 apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >>"$DIR/apt.log" 2>&1; then
            say "apt-get install ${PACKAGES[*]} failed; see $DIR/apt.log"
            return 1
        fi
    fi
    have_binaries || { say "packages installed but a Slurm or munge binary is missing"; return 1; }
}

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_works; then
        return 0
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating /etc/munge/munge.key"
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    runuser -u munge -- "$(PATH="$PATH:/usr/sbin" command -v munged)"
    local attempt
    for attempt in $(seq 50); do
        munge_works && return 0
        sleep 0.1
    done
    say "munged did not start (see /var/log/munge/munged.log)"
    return 1
}

write_conf() {
    local host node_line
    host="$(hostname -s)"
    if ! getent hosts "$host" >/dev/null; then
        say "the host name '$host' does not resolve (add it to /etc/hosts); Slurm needs it"
        return 1
    fi
    # The node's real CPUs, sockets and memory, as slurmd itself sees them.
    node_line="$(slurmd -C | head -n 1)"
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# Written by tests/slurm/cluster.sh: a one-node test cluster on $host.
ClusterName=metadist-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Short credential lifetime and a busy scheduler: a requeued job starts again within
# seconds instead of minutes.
AuthInfo=cred_expire=5
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# cgroup process tracking does not work in containers without systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=600
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
$node_line State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

cluster_ready() {
    scontrol ping 2>/dev/null | grep -q "is UP" || return 1
    local state
    state="$(sinfo -h -N -o %T 2>/dev/null | head -n 1)"
    [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]]
}

start() {
    local install=1
    [[ "${1:-}" == "--no-install" ]] && install=0
    mkdir -p "$DIR"
    if ((install)); then
        install_packages
    elif ! have_binaries; then
        say "Slurm/munge are not installed (run: bash tests/slurm/cluster.sh start)"
        return 1
    fi
    PATH="$PATH:/usr/sbin:/sbin"
    if [[ -s "$CONF" ]] && pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid" && cluster_ready; then
        say "already running (SLURM_CONF=$CONF)"
        return 0
    fi
    stop_daemons
    if [[ "$(id -u)" != 0 ]]; then
        say "starting the daemons needs root"
        return 1
    fi
    start_munge
    write_conf
    # A fresh state directory: no jobs left over from an earlier cluster (job ids restart at 1).
    rm -rf "$DIR/state" "$DIR/spool"
    mkdir -p "$DIR/state" "$DIR/spool"
    slurmctld -i -f "$CONF"
    slurmd -f "$CONF"
    local attempt
    for attempt in $(seq 100); do
        if cluster_ready; then
            say "running (SLURM_CONF=$CONF)"
            return 0
        fi
        sleep 0.2
    done
    say "the cluster did not come up; see $DIR/slurmctld.log and $DIR/slurmd.log"
    return 1
}

stop_daemons() {
    local name pidfile pid attempt
    for name in slurmd slurmctld; do
        pidfile="$DIR/$name.pid"
        if pid_alive "$pidfile"; then
            pid="$(cat "$pidfile")"
            kill "$pid" 2>/dev/null || true
            for attempt in $(seq 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
        fi
        rm -f "$pidfile"
    done
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) stop_daemons ;;
    status) PATH="$PATH:/usr/sbin:/sbin"; have_binaries && cluster_ready ;;
    *) echo "usage: $0 start [--no-install] | stop | status" >&2; exit 2 ;;
esac
