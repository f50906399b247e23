#!/usr/bin/env bash
# Sets up, builds and runs medfast's main job on its built-in default: the
# README's first command. Today the main job writes the built-in synthetic
# spleen dataset (medfast data synth) and inspects a case; `medfast train`
# takes its place when the training engine lands.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"

out=${MEDFAST_DATA:-data/spleen-synth}
./build/medfast data synth --out "$out"
./build/medfast info "$out/imagesTr/spleen_0.nii.gz" --stats
./build/medfast info "$out/labelsTr/spleen_0.nii.gz" --stats
