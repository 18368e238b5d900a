#!/bin/sh
# memwatch's Slurm prolog and epilog, in one script (docs/cluster.md):
#
#   slurm.conf:  Prolog=/usr/share/memwatch/slurm/prolog.sh
#                Epilog=/usr/share/memwatch/slurm/epilog.sh
#                PrologFlags=Contain   (recommended: the extern step holds the job for its whole life)
#
# The prolog attaches each job on this node by its id (`memwatch attach --slurm-job`); memwatch then
# follows every task the job starts here. The epilog detaches it.
#
# Who is followed:
#   MEMWATCH_SLURM_DEFAULT=on   every job, unless its comment says memwatch=off (opt-out; default)
#   MEMWATCH_SLURM_DEFAULT=off  only jobs whose comment says memwatch=on (opt-in)
#   e.g. `sbatch --comment=memwatch=off job.sh`
# Set it, and MEMWATCH (the memwatch program) or MEMWATCH_SOCKET (the daemon's control socket), in
# /etc/default/memwatch-slurm.
#
# A prolog that fails drains the node, so this script never fails: what goes wrong is logged
# (syslog, tag memwatch-slurm) and the job runs unwatched.

[ -r /etc/default/memwatch-slurm ] && . /etc/default/memwatch-slurm
MEMWATCH=${MEMWATCH:-memwatch}
SCONTROL=${SCONTROL:-scontrol}
DEFAULT=${MEMWATCH_SLURM_DEFAULT:-on}

log() {
    if command -v logger >/dev/null 2>&1; then
        logger -t memwatch-slurm -- "$*"
    else
        echo "memwatch-slurm: $*" >&2
    fi
}

id=${SLURM_JOB_ID:-}
case "$id" in
'' | *[!0-9]*)
    log "no usable SLURM_JOB_ID (${id:-unset}); nothing to do"
    exit 0
    ;;
esac

socket=
[ -n "${MEMWATCH_SOCKET:-}" ] && socket="--socket=$MEMWATCH_SOCKET"

# The job's comment: Slurm sets SLURM_JOB_COMMENT for prologs from 23.02 on; before, scontrol says.
wanted() {
    comment=${SLURM_JOB_COMMENT-}
    if [ -z "$comment" ]; then
        comment=$("$SCONTROL" show job -o "$id" 2>/dev/null | sed -n 's/.* Comment=\(.*\)$/\1/p')
    fi
    case "$comment" in
    *memwatch=off*) return 1 ;;
    *memwatch=on*) return 0 ;;
    esac
    [ "$DEFAULT" != off ]
}

case "$(basename "$0")" in
*prolog*)
    if wanted; then
        out=$("$MEMWATCH" attach --slurm-job "$id" $socket 2>&1) ||
            log "job $id: memwatch attach failed: $out"
    fi
    ;;
*epilog*)
    # Quiet when memwatch never followed the job (opted out, or it already saw it end).
    out=$("$MEMWATCH" detach --slurm-job "$id" $socket 2>&1) ||
        case "$out" in
        *"no attached job"*) ;;
        *) log "job $id: memwatch detach failed: $out" ;;
        esac
    ;;
*)
    log "run as prolog.sh or epilog.sh (the links to this script), not as $(basename "$0")"
    ;;
esac
exit 0
