#!/bin/sh
# Slurm Epilog: takes the job off each GPU file the prolog wrote, and removes a file no job is
# left in. The same directory and variables as prolog.sh.
set -eu

dir="${GPUWATCH_JOB_MAPPING_DIR:-/run/gpuwatch/job-mapping}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-}"

case "$job" in
    '' | *[!0-9_+]*) exit 0 ;;
esac
[ -d "$dir" ] || exit 0

(
    flock 9
    for gpu in $(printf '%s' "$gpus" | tr ',' ' '); do
        case "$gpu" in
            '' | *[!0-9]*) continue ;;
        esac
        file="$dir/$gpu"
        [ -f "$file" ] || continue
        grep -vx "$job" "$file" >"$dir/.$gpu.tmp" || true
        if [ -s "$dir/.$gpu.tmp" ]; then
            mv "$dir/.$gpu.tmp" "$file"
        else
            rm -f "$dir/.$gpu.tmp" "$file"
        fi
    done
) 9>"$dir/.lock"
