#!/usr/bin/env bash
# First contact, measured: what a new user meets on a fresh Debian 12 machine.
#
#   sudo bash scripts/first_contact.sh [--runs N] [--test] [--out DIR]
#
# For each of N runs (default 3): a fresh Debian 12 root (debootstrap's minimal system and
# nothing else; the apt archive cache empty), this checkout's HEAD cloned into it, then
# `bash scripts/run.sh` there, timed from outside, with the wall time of each phase
# (packages, configure, build, train: run.sh prints where each ends), the download size
# (the .deb files apt fetched) and whether the default run reached its Dice target. Then a
# second `bash scripts/run.sh` in the same root, which must continue the run. --test adds one
# fresh root in which `bash scripts/test.sh` runs, timed.
# Prints a table and the median; writes it, with each run's log, to DIR (default
# first-contact/, ignored by git).
#
# The roots are made from a template debootstrapped once per machine into
# ${MEDFAST_COMPAT_ROOT:-/var/cache/medfast}/bookworm-fresh (from the mirror this machine's apt
# sources name: scripts/debian_mirror.sh); each run copies it, so every run starts from the
# same fresh state, with nothing in ccache. Needs root (debootstrap, chroot, mounts in a
# private mount namespace: nothing stays mounted when the script ends).
set -euo pipefail

runs=3
with_test=0
src=$(cd "$(dirname "$0")/.." && pwd)
out=$src/first-contact
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --test) with_test=1; shift ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "first_contact: unknown argument '$1' (expected --runs N, --test, --out DIR)" >&2; exit 2 ;;
  esac
done
# The CPU by its model name (and family, which tells two EPYC generations apart): first-contact
# times differ 1.8x between 2-core machines, so a figure means nothing without it.
cpu_model() {
  local name family
  name=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
  family=$(awk -F': *' '/^cpu family/ { print $2; exit }' /proc/cpuinfo)
  printf '%s (family %s)' "${name:-an unnamed CPU}" "${family:-?}"
}
case "$runs" in ''|*[!0-9]*|0) echo "first_contact: --runs: expected a whole number of at least 1, got '$runs'" >&2; exit 2 ;; esac
if [ "$(id -u)" -ne 0 ]; then
  echo "first_contact: needs root (debootstrap, chroot and mounts); run it with sudo" >&2
  exit 2
fi
mirror=$(bash "$src/scripts/debian_mirror.sh" || true)
if [ -z "$mirror" ]; then
  echo "first_contact: no Debian mirror in this machine's apt sources; set MEDFAST_COMPAT_MIRROR" >&2
  exit 2
fi
base=${MEDFAST_COMPAT_ROOT:-/var/cache/medfast}
template=$base/bookworm-fresh
work=$base/first-contact
mkdir -p "$out" "$base"
say() { echo "first_contact: $*"; }

# 1. The template: debootstrap once, its downloaded packages removed.
if [ ! -f "$template/.medfast-debootstrap" ]; then
  command -v debootstrap >/dev/null || {
    say "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  rm -rf "$template.partial"
  say "debootstrap bookworm (minbase) into $template"
  debootstrap --variant=minbase bookworm "$template.partial" "$mirror" > "$base/debootstrap-bookworm.log" 2>&1 || {
    echo "first_contact: debootstrap failed; see $base/debootstrap-bookworm.log" >&2
    tail -5 "$base/debootstrap-bookworm.log" >&2; exit 1; }
  printf 'deb %s bookworm main\n' "$mirror" > "$template.partial/etc/apt/sources.list"
  rm -f "$template.partial"/var/cache/apt/archives/*.deb "$template.partial"/var/lib/apt/lists/*_Packages
  rm -rf "$template"
  mv "$template.partial" "$template"
  touch "$template/.medfast-debootstrap"
fi

commit=$(git -C "$src" rev-parse --short HEAD)
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
  say "note: the checkout has uncommitted changes; the roots get HEAD ($commit) as a user's clone would"
fi

# A root left by an interrupted run is removed on the way out (each is a few GB).
current_root=""
trap '[ -n "$current_root" ] && rm -rf "$current_root"' EXIT

# One fresh root: the template copied, HEAD cloned into /root/medfast.
fresh_root() {
  local root=$1
  current_root=$root
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  cp -a "$template" "$root"
  git clone -q --no-hardlinks "$src" "$root/root/medfast"
}

# Runs `bash scripts/<script>` in <root>, its output into <log>.
in_fresh_root() {
  local root=$1 script=$2 log=$3
  MEDFAST_FC_ROOT=$root MEDFAST_FC_SCRIPT=$script unshare --mount --propagation private -- bash -c '
    set -euo pipefail
    root=$MEDFAST_FC_ROOT
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t sysfs sys "$root/sys" 2>/dev/null || true
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb \
      bash -c "cd /root/medfast && bash scripts/$MEDFAST_FC_SCRIPT" 2>&1
  ' > "$log" 2>&1
}

phase_of() {  # phase_of LOG "packages ready": the seconds run.sh printed for that phase
  sed -n "s/^run.sh: $2 (\([0-9]*\) s)\$/\1/p" "$1" | head -n 1
}

results=$out/first_contact.md
{
  echo "# First contact ($(date -u +%Y-%m-%d), commit $commit, $(nproc) cores of $(cpu_model), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo))"
  echo
  echo "| run | packages s | configure s | build s | train s | total | download MB | first epoch line | Dice target | second run.sh |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
} > "$results"
totals=()
for i in $(seq 1 "$runs"); do
  root=$work/run$i
  say "run $i of $runs: fresh root $root"
  fresh_root "$root"
  log=$out/run$i.log
  start=$(date +%s.%N)
  status=0
  in_fresh_root "$root" run.sh "$log" || status=$?
  total=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  pk=$(phase_of "$log" "packages ready"); cf=$(phase_of "$log" "configured"); bd=$(phase_of "$log" "built")
  train=$(awk -v t="$total" -v a="${pk:-0}" -v b="${cf:-0}" -v c="${bd:-0}" 'BEGIN { printf "%.0f", t - a - b - c }')
  mb=$(find "$root/var/cache/apt/archives" -name '*.deb' -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s / 1e6 }')
  reached="no (exit $status)"
  if [ "$status" = 0 ] && grep -q "target .* reached after" "$log"; then
    reached=$(sed -n 's/^best dice \([0-9.]*\) at epoch \([0-9]*\).*/Dice \1, epoch \2/p' "$log" | tail -n 1)
  fi
  # The wait for the first epoch line: metrics.jsonl's process_seconds of epoch 1.
  first=$( (head -n 1 "$root/root/medfast/runs/default/metrics.jsonl" 2>/dev/null || true) \
          | sed -n 's/.*"process_seconds":\([0-9.]\{1,\}\).*/\1/p' | awk '{ printf "%.1f", $1 }')
  second="no"
  if in_fresh_root "$root" run.sh "$out/run$i-again.log" && grep -q "continuing it (--resume)" "$out/run$i-again.log"; then
    second="continued"
  fi
  printf '| %s | %s | %s | %s | %s | %d:%02d | %s | %s s | %s | %s |\n' "$i" "${pk:-?}" "${cf:-?}" "${bd:-?}" "$train" \
    $((total / 60)) $((total % 60)) "$mb" "${first:-?}" "$reached" "$second" >> "$results"
  totals+=("$total")
  say "run $i: $((total / 60)) min $((total % 60)) s (packages ${pk:-?} s, configure ${cf:-?} s, build ${bd:-?} s, train $train s; $mb MB downloaded; first epoch line after ${first:-?} s; $reached; second run.sh: $second)"
  rm -rf "$root"
done
median=$(printf '%s\n' "${totals[@]}" | sort -n | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.0f", m }')
{ echo; echo "Median of $runs: $((median / 60)) min $((median % 60)) s (\`bash scripts/run.sh\`, apt included)."; } >> "$results"

if [ "$with_test" = 1 ]; then
  root=$work/test
  say "scripts/test.sh in a fresh root $root"
  fresh_root "$root"
  start=$(date +%s.%N)
  status=0
  in_fresh_root "$root" test.sh "$out/test.log" || status=$?
  total=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  summary=$(grep -o "[0-9]*% tests passed, [0-9]* tests failed out of [0-9]*" "$out/test.log" | tr '\n' ';' || true)
  { echo; echo "\`bash scripts/test.sh\` from a fresh root: $((total / 60)) min $((total % 60)) s, exit $status ($summary)."; } \
    >> "$results"
  rm -rf "$root"
fi
echo
cat "$results"
