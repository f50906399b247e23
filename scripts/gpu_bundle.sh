#!/usr/bin/env bash
# Gathers what building medfast needs beyond a compiler, CMake, ninja and a libtorch,
# from Debian 12's own packages, into .gpu/ (ignored by git): the folder that travels to
# a lent GPU machine, whose image has CUDA, a pip torch, CMake and ninja but no package
# registry (scripts/gpu_check.sh builds there with -DMEDFAST_DEPS_PREFIX=.gpu/usr).
#
#   bash scripts/gpu_bundle.sh [OUT]     (default OUT: .gpu in the repository root)
#
# Nothing is compiled: `apt-get download` fetches the .deb files (headers, static libraries,
# CMake and pkg-config files, and the shared libraries of the few without a static one,
# with their sonames: they sit on the build tree's rpath), `dpkg -x` unpacks them under
# OUT/usr, and the pkg-config files are made relocatable (prefix=${pcfiledir}/../../..).
# Where a package ships both, the shared library's link-time name (lib*.so) is removed so
# that the static one links. Docs, man pages and binaries are left out. Idempotent: the
# .deb files are kept in OUT-debs (beside OUT, so that they do not travel with it) and a
# second run only unpacks again. OUT/MANIFEST lists each package, its version and what it is for.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.gpu}")
limit_mib=40

# package: what medfast uses it for
PACKAGES=(
  "liburing-dev:io_uring backend (static)"
  "libdeflate-dev:gzip for .nii.gz (static)"
  "zlib1g-dev:gzip fallback and GDCM (static)"
  "libxxhash-dev:cache checksums (static)"
  "libyaml-cpp-dev:YAML configs (CMake package)"
  "libyaml-cpp0.7:YAML configs (the shared library the CMake package names)"
  "nlohmann-json3-dev:JSON (headers)"
  "libcli11-dev:the command line (headers)"
  "libgloo-dev:Gloo headers, where the libtorch has none of its own (DDP)"
  "libjpeg62-turbo-dev:DICOM 8-bit lossy JPEG (headers)"
  "libjpeg62-turbo:DICOM 8-bit lossy JPEG (shared: Debian's libjpeg.a is not position-independent)"
  "libopenjp2-7-dev:DICOM JPEG 2000 (headers; the shared library below: its .a is not position-independent)"
  "libcharls-dev:DICOM JPEG-LS (headers)"
  "libcharls2:DICOM JPEG-LS (shared: Debian ships no static CharLS)"
  "libgdcm-dev:DICOM writing (headers)"
  "libgdcm3.0:DICOM writing (shared)"
  "libjson-c5:needed by GDCM"
  "libsocket++1:needed by GDCM"
  "libopenjp2-7:needed by GDCM"
  "libexpat1:needed by GDCM"
  "libuuid1:needed by GDCM"
  "googletest:GoogleTest and GoogleMock headers"
  "libgtest-dev:GoogleTest (static)"
  "libgmock-dev:GoogleMock (static)"
  "pkgconf-bin:pkg-config, for a machine without one (usr/bin/pkg-config)"
  "libpkgconf3:pkg-config's library"
)

say() { echo "gpu_bundle: $*"; }
debs=$out-debs
mkdir -p "$debs"
names=()
for entry in "${PACKAGES[@]}"; do names+=("${entry%%:*}"); done

missing=()
for p in "${names[@]}"; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "downloading ${#missing[@]} packages from this machine's apt sources"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  (cd "$debs" && apt-get download -qq "${missing[@]}")
fi

rm -rf "$out"
mkdir -p "$out"
for entry in "${PACKAGES[@]}"; do
  p=${entry%%:*}
  deb=$(ls "$debs/${p}_"*.deb | head -n 1)
  dpkg -x "$deb" "$out"
  printf '%-22s %-28s %s\n' "$p" "$(dpkg-deb -f "$deb" Version)" "${entry#*:}" >> "$out/MANIFEST"
done

# Keep what a build reads: headers, libraries, CMake and pkg-config files (GoogleTest's
# sources in usr/src are not: libgtest-dev has it built). Everything else goes.
rm -rf "$out/usr/src" "$out/usr/share/doc" "$out/usr/share/man" "$out/usr/share/lintian" "$out/usr/sbin" \
       "$out/usr/share/bug" "$out/usr/share/gdcm-3.0" "$out/usr/lib/x86_64-linux-gnu/gdcm-3.0"
lib=$out/usr/lib/x86_64-linux-gnu
# Of the programs only pkgconf stays, behind a pkg-config that finds its library here and
# searches the bundle's .pc files (CMake uses it where the machine has no pkg-config).
find "$out/usr/bin" -mindepth 1 ! -name pkgconf -exec rm -rf {} +
cat > "$out/usr/bin/pkg-config" <<'SH'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
export PKG_CONFIG_PATH="$here/lib/x86_64-linux-gnu/pkgconfig:$here/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
LD_LIBRARY_PATH="$here/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/pkgconf" "$@"
SH
chmod +x "$out/usr/bin/pkg-config"
# Static libraries link where they are position-independent. The Python module is a
# shared object, and some of Debian's archives are not ("relocation R_X86_64_PC32 against
# z_errmsg can not be used when making a shared object", then the same for libopenjp2 on
# the first GPU machine): those link their shared library, bundled beside them, or, for
# zlib, the libz.so.1 every image has, through a linker script (the -dev symlink points
# at /lib, outside the bundle).
pic() {
  printf 'int medfast_bundle_probe(void) { return 0; }\n' > "$out/probe.c"
  ${CC:-cc} -shared -fPIC "$out/probe.c" -o "$out/probe.so" -Wl,--whole-archive "$1" -Wl,--no-whole-archive \
    -Wl,--unresolved-symbols=ignore-all 2>/dev/null
}
for a in "$lib"/*.a; do
  so=${a%.a}.so
  if pic "$a"; then
    [ -L "$so" ] && rm -f "$so"  # the static library links
  elif [ "$(basename "$a")" = libz.a ]; then
    rm -f "$a" "$so"
    echo "INPUT(libz.so.1)" > "$so"
    say "libz.a is not position-independent: libz.so names the system's libz.so.1"
  elif [ -e "$so" ]; then
    rm -f "$a"
    say "$(basename "$a") is not position-independent: $(basename "$so") (shared, bundled) links"
  else
    case "$(basename "$a")" in
      libdeflate.a|liburing.a|libxxhash.a)  # medfast links these into the Python module
        say "$(basename "$a") is not position-independent and has no shared library in the bundle: the Python module cannot link it"
        exit 1 ;;
      *) say "$(basename "$a") is not position-independent and has no shared library here (medfast does not link it)" ;;
    esac
  fi
done
rm -f "$out/probe.c" "$out/probe.so"
for pc in "$lib"/pkgconfig/*.pc "$out"/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] || continue
  # prefix is usr: three folders up from usr/lib/x86_64-linux-gnu/pkgconfig, two from usr/share/pkgconfig
  case "$pc" in
    "$lib"/pkgconfig/*) up='${pcfiledir}/../../..' ;;
    *) up='${pcfiledir}/../..' ;;
  esac
  sed -i -e "s|^prefix=/usr\$|prefix=$up|" -e 's|=/usr/|=${prefix}/|' "$pc"
done
# Debian's libgloo-dev puts its headers in usr/include/gloo; they are used only where the
# libtorch has none (pip wheels ship their own), so they move aside.
if [ -d "$out/usr/include/gloo" ]; then
  mkdir -p "$out/usr/include-gloo"
  rm -rf "$out/usr/include-gloo/gloo"
  mv "$out/usr/include/gloo" "$out/usr/include-gloo/gloo"
fi

mib=$(( $(du -sb "$out" | cut -f1) / 1048576 ))
say "$out/usr: $(find "$out/usr" -type f | wc -l) files, ${mib} MiB (limit ${limit_mib} MiB); packages in $out/MANIFEST"
if [ "$mib" -ge "$limit_mib" ]; then
  echo "gpu_bundle: the bundle is ${mib} MiB, over its ${limit_mib} MiB limit" >&2
  exit 1
fi
