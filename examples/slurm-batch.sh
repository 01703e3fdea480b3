#!/bin/bash
# Writes build IDs into every perf.data under FLEET, spread over a Slurm job array.
#
#   sbatch --array=0-15 examples/slurm-batch.sh /shared/fleet /shared/fleet-bid
#
# Each array task processes the recordings whose path (relative to FLEET) hashes to
# its index (--shard auto reads SLURM_ARRAY_TASK_ID/_MIN/_MAX), so the tasks share
# nothing but the output tree and every output is written by exactly one task. Outputs
# keep their path under OUT: FLEET/host17/perf.data -> OUT/host17/perf.data. A task
# that fails or is cut short can be rerun as it is: finished outputs are skipped.
# Exit code of a task: 0 all done, 3 some recordings failed (see its report), 1 none.
#
# PDINJECT names the binary (default: pdinject on PATH). SYMBOL_STORE, when set, is a
# folder on the shared filesystem that every task fills with the DSOs it proves
# (--symbol-store, docs/store.md), for a debuginfod serving the fleet.
#SBATCH --job-name=pdinject-batch
#SBATCH --cpus-per-task=4
#SBATCH --output=pdinject-%A_%a.out
set -euo pipefail
FLEET=${1:?usage: sbatch --array=0-N slurm-batch.sh FLEET OUT}
OUT=${2:?usage: sbatch --array=0-N slurm-batch.sh FLEET OUT}
mkdir -p "$OUT"
exec "${PDINJECT:-pdinject}" batch --buildids \
    --shard auto \
    --jobs "${SLURM_CPUS_PER_TASK:-1}" \
    --out-dir "$OUT" \
    --report "$OUT/report-${SLURM_ARRAY_TASK_ID}.jsonl" \
    --quiet \
    ${SYMBOL_STORE:+--symbol-store "$SYMBOL_STORE"} \
    "$FLEET"
