#!/usr/bin/env bash
# Builds railguard's Debian packages:
#   railguard             the admin CLI, its man pages and shell completions
#   railguard-supervisor  the supervisor, its systemd unit, /etc/railguard/supervisor.toml
#   railguard-agent       the node agent, its systemd unit, /etc/railguard/agent.toml
# Usage: scripts/package.sh [--bins DIR] [--out DIR]
#   --bins DIR  package the binaries in DIR (default: cargo build --release)
#   --out DIR   where the .deb files go (default: target/debian)
set -euo pipefail
cd "$(dirname "$0")/.."

bins=""
out="target/debian"
while [ $# -gt 0 ]; do
  case "$1" in
    --bins) bins="${2:?--bins needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in dpkg-deb dpkg gzip; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is needed (a Debian system)" >&2; exit 1; }
done
if [ -z "$bins" ]; then
  cargo build --release --bins
  bins=target/release
fi
for b in railguard railguard-supervisor railguard-agent; do
  [ -x "$bins/$b" ] || { echo "package.sh: $bins/$b is missing or not executable" >&2; exit 1; }
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "package.sh: no version in Cargo.toml [workspace.package]" >&2; exit 1; }
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out"

# The Debian packages a binary's shared libraries come from.
depends_of() {
  ldd "$1" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u \
    | while read -r lib; do dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true; done \
    | cut -d: -f1 | sort -u | paste -sd, - | sed 's/,/, /g'
}

# pkg NAME BINARY SUMMARY [DEPENDS]: stages $stage/NAME (already filled)
# into NAME_VERSION_ARCH.deb; DEPENDS adds to the libraries' packages.
pkg() {
  local name=$1 bin=$2 summary=$3 extra=${4:-} root=$stage/$1
  mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$name"
  printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: railguard\n\nFiles: *\nCopyright: railguard developers\nLicense: Apache-2.0\n On Debian systems the license is in /usr/share/common-licenses/Apache-2.0.\n' \
    > "$root/usr/share/doc/$name/copyright"
  local deps
  deps=$(depends_of "$bin")
  cat > "$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: railguard developers <railguard@localhost>
Section: admin
Priority: optional
Depends: ${deps:-libc6}${extra:+, $extra}
Description: $summary
 railguard keeps GPU training jobs alive through NIC and cable faults:
 node agents watch links and carry out orders, a Raft-replicated
 supervisor detects faults and orchestrates the cure.
CONTROL
  if [ -d "$root/etc" ]; then
    (cd "$root" && find etc -type f | sed 's|^|/|' | sort) > "$root/DEBIAN/conffiles"
  fi
  find "$root" -type d -exec chmod 0755 {} +
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/${name}_${version}_${arch}.deb" >/dev/null
  echo "$out/${name}_${version}_${arch}.deb"
}

# The CLI: binary, man pages, completions.
r=$stage/railguard
install -D -m 0755 "$bins/railguard" "$r/usr/bin/railguard"
mkdir -p "$r/usr/share/man/man1"
"$bins/railguard" man --dir "$r/usr/share/man/man1" >/dev/null
gzip -9n "$r"/usr/share/man/man1/*.1
install -d "$r/usr/share/bash-completion/completions" "$r/usr/share/zsh/vendor-completions" \
  "$r/usr/share/fish/vendor_completions.d"
"$bins/railguard" completion bash > "$r/usr/share/bash-completion/completions/railguard"
"$bins/railguard" completion zsh > "$r/usr/share/zsh/vendor-completions/_railguard"
"$bins/railguard" completion fish > "$r/usr/share/fish/vendor_completions.d/railguard.fish"
pkg railguard "$bins/railguard" "railguard admin CLI (status, drain, failover, jobs)"

# daemon NAME CONFIG SUMMARY POSTINST [DEPENDS]: a service's package — its
# binary, unit and config — whose postinst runs POSTINST at configure,
# then reloads systemd if it runs.
daemon() {
  local name=$1 config=$2 summary=$3 body=$4 extra=${5:-} r=$stage/$1
  install -D -m 0755 "$bins/$name" "$r/usr/bin/$name"
  install -D -m 0644 "packaging/systemd/$name.service" "$r/lib/systemd/system/$name.service"
  install -D -m 0644 "packaging/etc/$config" "$r/etc/railguard/$config"
  mkdir -p "$r/DEBIAN"
  printf '#!/bin/sh\nset -e\nif [ "$1" = configure ]; then\n%s\n  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\nfi\n' \
    "$body" > "$r/DEBIAN/postinst"
  chmod 0755 "$r/DEBIAN/postinst"
  pkg "$name" "$bins/$name" "$summary" "$extra"
}

# The supervisor: runs as the unprivileged system user railguard.
daemon railguard-supervisor supervisor.toml "railguard supervisor (replicated with Raft)" \
'  if ! getent passwd railguard >/dev/null; then
    adduser --system --group --home /var/lib/railguard --no-create-home railguard >/dev/null
  fi
  install -d -m 0750 -o root -g railguard /etc/railguard/tls' adduser

# The agent: runs as root with a bounded set of capabilities.
daemon railguard-agent agent.toml "railguard node agent (links, probes, orders, ranks)" \
'  install -d -m 0750 /etc/railguard/tls'
