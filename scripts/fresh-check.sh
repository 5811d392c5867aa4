#!/usr/bin/env bash
# Rehearses a fresh machine: builds a Debian 12 root with debootstrap under
# target/fresh/, puts into it only what a new machine of this project's kind
# has (see FRESH_PKGS), clones the committed tree into it and runs, inside a
# chroot, `make run` and then `make test-smoke` (or `make test` with --full).
# Any package the build or the tests need that scripts/setup.sh does not
# install makes this fail, even when this machine has it.
#
#   scripts/fresh-check.sh [--full] [--ref REF] [--keep]
#     --full   run the whole `make test` instead of the smoke subset
#     --ref    the commit to check (default HEAD; uncommitted edits are not seen)
#     --keep   leave the used root in target/fresh/root for inspection
#
# Needs root (debootstrap, chroot, mounts) and a reachable Debian mirror.
# The Rust toolchain is bind-mounted read-only from ~/.rustup (a new machine
# has rustup); the cargo registry inside starts empty. Timings and the list
# of packages setup.sh installed are written to target/fresh/report.txt.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
FRESH=$REPO/target/fresh
BASE=$FRESH/base
ROOT=$FRESH/root
REPORT=$FRESH/report.txt
MIRROR=${FRESH_MIRROR:-http://deb.debian.org/debian}

# What a new machine of this kind has (FACTS.md, "A fresh machine"): gcc,
# g++, make, cmake, ninja, GoogleTest, Python 3.11 with pytest (and its venv
# and pip), Java 17 with Maven, Node with npm, Go, git, gdb, valgrind and a
# PostgreSQL client, on Debian's standard system (debootstrap's default).
FRESH_PKGS=gcc,g++,make,cmake,ninja-build,libgtest-dev,python3,python3-pytest,python3-venv,python3-pip,openjdk-17-jdk-headless,maven,nodejs,npm,golang-go,git,gdb,valgrind,postgresql-client,ca-certificates,curl,xz-utils

full=0; ref=HEAD; keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --full) full=1 ;;
    --ref) ref=$2; shift ;;
    --keep) keep=1 ;;
    *) echo "fresh-check: unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { echo "fresh-check: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || {
  echo "fresh-check: installing debootstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
sha=$(git rev-parse --verify "$ref^{commit}")
mkdir -p "$FRESH"

# Everything mounted below $1, deepest first.
mounts_under() { findmnt -rn -o TARGET | awk -v r="$1" 'index($0, r"/") == 1 || $0 == r' | sort -r; }

unmount_all() {
  local m
  for m in $(mounts_under "$ROOT"); do umount -l "$m" 2>/dev/null || true; done
}

# Removes the work root, never through a mount into the host.
remove_root() {
  unmount_all
  if [ -n "$(mounts_under "$ROOT")" ]; then
    echo "fresh-check: still mounted under $ROOT, not removing it:" >&2
    mounts_under "$ROOT" >&2
    return 1
  fi
  rm -rf "$ROOT"
}

# The base root is built once and reused while the package list is the same.
stamp=$(printf '%s %s' "$FRESH_PKGS" "$MIRROR" | sha256sum | cut -c1-16)
if [ ! -f "$BASE/.fresh-$stamp" ]; then
  rm -rf "$BASE" "$BASE.tmp"
  echo "fresh-check: debootstrap bookworm into $BASE (a few minutes, once)" >&2
  t0=$(date +%s)
  debootstrap --include=ca-certificates bookworm "$BASE.tmp" "$MIRROR" > "$FRESH/debootstrap.log" 2>&1 || {
    echo "fresh-check: debootstrap failed; see $FRESH/debootstrap.log" >&2; exit 1; }
  # apt, not debootstrap's --include, resolves the packages' dependencies.
  mount -t proc proc "$BASE.tmp/proc"
  cp /etc/resolv.conf "$BASE.tmp/etc/resolv.conf"
  ok=0
  chroot "$BASE.tmp" env DEBIAN_FRONTEND=noninteractive sh -c \
    "apt-get update -qq && apt-get install -y -qq --no-install-recommends $(echo "$FRESH_PKGS" | tr , ' ') && apt-get clean" \
    >> "$FRESH/debootstrap.log" 2>&1 && ok=1
  umount "$BASE.tmp/proc"
  [ $ok = 1 ] || { echo "fresh-check: installing the base packages failed; see $FRESH/debootstrap.log" >&2; exit 1; }
  touch "$BASE.tmp/.fresh-$stamp"
  mv "$BASE.tmp" "$BASE"
  echo "fresh-check: base root built in $(( $(date +%s) - t0 )) s" >&2
fi

remove_root
echo "fresh-check: copying the base root" >&2
cp -a "$BASE" "$ROOT"
trap 'if [ $keep = 1 ]; then unmount_all; else remove_root; fi' EXIT

mkdir -p "$ROOT/work" "$ROOT/root/.rustup" "$ROOT/root/.cargo/bin"
git clone -q --no-hardlinks "$REPO" "$ROOT/work/strom"
git -C "$ROOT/work/strom" checkout -q "$sha"
# The machine's network, not the project: its resolver, the certificate
# authorities this host trusts (an egress proxy's CA, say; Java's keystore
# follows through update-ca-certificates) and pip's settings for them.
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  mount -t proc proc "$ROOT/proc"
  chroot "$ROOT" update-ca-certificates >/dev/null 2>&1
  umount "$ROOT/proc"
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
ca_env=()
for v in SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE REQUESTS_CA_BUNDLE PIP_CERT NODE_EXTRA_CA_CERTS GIT_SSL_CAINFO AWS_CA_BUNDLE; do
  if [ -n "${!v:-}" ]; then ca_env+=("$v=${!v}"); fi
done
mount -t proc proc "$ROOT/proc"
mount -t sysfs sys "$ROOT/sys"
# A /dev of its own (a tmpfs with the usual nodes), not a bind of the
# host's: removing the root can then never delete a host device node.
mount -t tmpfs -o mode=755 fresh-dev "$ROOT/dev"
for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
  set -- $n; mknod -m 666 "$ROOT/dev/$1" c "$2" "$3"
done
mkdir -p "$ROOT/dev/pts" "$ROOT/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$ROOT/dev/pts"
ln -s pts/ptmx "$ROOT/dev/ptmx"
mount -t tmpfs -o mode=1777 fresh-shm "$ROOT/dev/shm"
ln -s /proc/self/fd "$ROOT/dev/fd"
for d in .rustup .cargo/bin; do
  mount --bind "$HOME/$d" "$ROOT/root/$d"
  mount -o remount,bind,ro "$ROOT/root/$d"
done

chroot "$ROOT" dpkg-query -W -f '${Package}\n' | sort > "$FRESH/pkgs-before.txt"
target=test-smoke; [ $full = 1 ] && target=test
echo "fresh-check: make run, then make $target, in the fresh root at ${sha:0:7}" >&2
status=0
chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  RUSTUP_TOOLCHAIN="$(rustup show active-toolchain | cut -d' ' -f1)" CARGO_INCREMENTAL=0 "${ca_env[@]}" \
  bash -c "cd /work/strom
    t0=\$(date +%s); make run || exit 11; t1=\$(date +%s)
    echo \"make-run-seconds \$((t1 - t0))\" > /tmp/times
    make $target || exit 12; t2=\$(date +%s)
    echo \"make-$target-seconds \$((t2 - t1))\" >> /tmp/times
    git status --porcelain > /tmp/dirty; [ ! -s /tmp/dirty ] || { cat /tmp/dirty; exit 13; }" \
  || status=$?
chroot "$ROOT" dpkg-query -W -f '${Package}\n' | sort > "$FRESH/pkgs-after.txt"

{
  echo "fresh-check at $sha, $(date -u +%FT%TZ), exit $status"
  cat "$ROOT/tmp/times" 2>/dev/null || true
  echo "packages installed by the build (scripts/setup.sh and make):"
  comm -13 "$FRESH/pkgs-before.txt" "$FRESH/pkgs-after.txt" | tr '\n' ' '; echo
} > "$REPORT"
cat "$REPORT"
case $status in
  0) echo "fresh-check: passed" ;;
  11) echo "fresh-check: FAILED: make run failed on a fresh machine" ;;
  12) echo "fresh-check: FAILED: make $target failed on a fresh machine" ;;
  13) echo "fresh-check: FAILED: the tests left tracked or untracked files changed" ;;
  *) echo "fresh-check: FAILED (exit $status)" ;;
esac
exit $status
