#!/bin/sh
# Slurm Prolog: records which job holds which GPU, in dcgm-exporter's job mapping format (one
# file per GPU, named by its index, holding the ids of the jobs allocated it, one per line), so
# that a GPU allocated with no process on it still belongs to its job. dcgm-exporter's
# --hpc-job-mapping-dir reads the same directory.
#
# slurm.conf: Prolog= a copy of this file, and Epilog= a copy of epilog.sh. Slurm runs them as
# root with SLURM_JOB_ID and SLURM_JOB_GPUS (the GPU indices, comma-separated) set; the
# directory is GPUWATCH_JOB_MAPPING_DIR, by default /run/gpuwatch/job-mapping.
set -eu

dir="${GPUWATCH_JOB_MAPPING_DIR:-/run/gpuwatch/job-mapping}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-}"

case "$job" in
    '' | *[!0-9_+]*) exit 0 ;; # no job, or not an id: nothing to record
esac
[ -n "$gpus" ] || exit 0

mkdir -p "$dir"
chmod 0755 "$dir"
(
    flock 9
    for gpu in $(printf '%s' "$gpus" | tr ',' ' '); do
        case "$gpu" in
            '' | *[!0-9]*) continue ;;
        esac
        file="$dir/$gpu"
        if ! grep -qx "$job" "$file" 2>/dev/null; then
            printf '%s\n' "$job" >>"$file"
        fi
        chmod 0644 "$file"
    done
) 9>"$dir/.lock"
