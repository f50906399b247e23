#!/usr/bin/env bash
# Prints the Debian mirror to make roots from (scripts/compat.sh, scripts/first_contact.sh):
# MEDFAST_COMPAT_MIRROR where set, else the first main archive this machine's own apt sources
# name (deb822 .sources files or one-line sources.list entries; security archives skipped).
# Prints nothing (exit 1) where there is none. No mirror's host is named in the repository.
set -euo pipefail
if [ -n "${MEDFAST_COMPAT_MIRROR:-}" ]; then echo "$MEDFAST_COMPAT_MIRROR"; exit 0; fi
found=$(
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) print $i; break } }' "$f"
  done
)
[ -n "$found" ] || exit 1
echo "$found" | head -n 1
