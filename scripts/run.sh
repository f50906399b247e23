#!/usr/bin/env bash
# Sets up, builds and runs medfast's main job on its built-in default: the
# README's first command. `medfast train` with no config writes a small
# synthetic spleen-like dataset (data/synth-small), caches its preprocessing
# in memory and trains a small UNet on the CPU until the validation Dice
# reaches 0.85 (at most 40 epochs; a few seconds on 2 cores), printing loss,
# Dice and per-stage times each epoch. Checkpoints and metrics go to
# runs/default/; run again, it continues that run (arguments, e.g.
# --overwrite, go to `medfast train`).
#
# Only what the command needs is installed (scripts/setup.sh, no option) and built
# (the medfast_front target: no tests, no Python module). Each phase's time is printed
# ("run.sh: ... (N s)"): scripts/first_contact.sh reads them.
set -euo pipefail
cd "$(dirname "$0")/.."

phase_start=$SECONDS
phase() {  # phase WHAT: says how long the phase that just ended took
  echo "run.sh: $1 ($(( SECONDS - phase_start )) s)"
  phase_start=$SECONDS
}

bash scripts/setup.sh
phase "packages ready"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
phase "configured"
cmake --build build -j "$(nproc)" --target medfast_front
phase "built"

# Run again, the default run continues where it stopped (or reports that it finished).
if [ $# -eq 0 ] && [ -f runs/default/last.ckpt ]; then
  echo "runs/default holds a run: continuing it (--resume); pass --overwrite to start again"
  exec ./build/medfast train --resume
fi
exec ./build/medfast train "$@"
