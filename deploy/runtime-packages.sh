#!/bin/sh
# Prints, one a line, the Debian packages holding the shared libraries that the given programs
# and modules load (ldd), so an image's runtime stage installs those and nothing of the build's.
# Used by deploy/Dockerfile; exits 1 naming a library that no package holds.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$@"; do
  ldd "$f"
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u >"$tmp/libs"
# Each library under every name dpkg may have registered it by: with merged /usr a file is
# registered under /lib or /usr/lib, an alternatives link (libblas.so.3) only where it points.
while read -r lib; do
  real=$(readlink -f "$lib")
  for path in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    printf '%s %s\n' "$lib" "$path"
  done
done <"$tmp/libs" >"$tmp/candidates"
cut -d' ' -f2 "$tmp/candidates" | sort -u >"$tmp/paths"
# One pass over dpkg's file lists (dpkg-query -S per library takes a second each).
grep -xF -f "$tmp/paths" /var/lib/dpkg/info/*.list >"$tmp/owners" || true
awk -v owners="$tmp/owners" '
  BEGIN {
    # /var/lib/dpkg/info/PACKAGE[:ARCH].list:PATH
    while ((getline line < owners) > 0) {
      i = index(line, ".list:")
      package = substr(line, 1, i - 1)
      sub(/.*\//, "", package)
      sub(/:.*/, "", package)
      owner[substr(line, i + 6)] = package
    }
  }
  { wanted[$1] = 1 }
  !($1 in found) && ($2 in owner) { found[$1] = owner[$2] }
  END {
    missing = 0
    for (lib in wanted) {
      if (!(lib in found)) {
        print "runtime-packages: no package holds " lib > "/dev/stderr"
        missing = 1
      }
    }
    for (lib in found) print found[lib] | "sort -u"
    close("sort -u")
    exit missing
  }' "$tmp/candidates"
