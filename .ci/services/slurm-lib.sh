#!/usr/bin/env bash
# Shared by slurm.sh (the one-node cluster) and slurm-multi.sh (the nodes in
# network namespaces): sourced, never run. Set `tag` (the log prefix) first.

# alive NAME PIDFILE: the pid in PIDFILE runs a process called NAME.
alive() {
    local pid
    [[ -s "$2" ]] || return 1
    pid=$(<"$2")
    [[ -r "/proc/$pid/comm" && "$(<"/proc/$pid/comm")" == "$1" ]]
}

# stop NAME PIDFILE: only daemons started from our own pid files, never by name.
stop() {
    local pid deadline
    alive "$1" "$2" || return 0
    pid=$(<"$2")
    kill "$pid"
    deadline=$((SECONDS + 20))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "${tag:-slurm}: $1 (pid $pid) did not stop in 20s" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# slurm_conf_common STATE_DIR: the slurm.conf lines both clusters share (root
# daemons, munge, no cgroups, no accounting database).
slurm_conf_common() {
    cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Without a database, sacct -c reads this job-completion file.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$1/jobcomp.txt
# Test suites submit bursts of short jobs; room so submissions are never refused.
MaxJobCount=100000
# A node that was DOWN comes back as soon as its slurmd registers.
ReturnToService=2
CONF
}
