#!/usr/bin/env bash
# Installs what building and testing railguard needs on Debian, if missing.
# Idempotent; needs root (or sudo) only when something must be installed.
set -euo pipefail

# Debian packages: a C toolchain for -sys crates, pkg-config, and iproute2
# (network namespaces for the testbed). protoc is vendored by the build.
# The rdma crate's `verbs` feature: rdma-sys runs bindgen over the
# libibverbs/librdmacm headers, which needs libclang, and clang's own
# headers (libclang-common-14-dev, else `stddef.h` is not found). Bookworm's
# clang 14 works with rdma-sys's old bindgen; clang 16+ does not. python3
# runs the layout check and the security scenario's non-rank process;
# passwd provides useradd (the testbed creates the `railguard-job` user).
# python3-pytest runs the Python client's tests; python3-torch (1.13, CPU,
# gloo; about a minute to install) runs the PyTorch example they train:
# Debian's build needs no CUDA wheels, unlike PyPI's current torch.
# iperf3 is the unmodified TCP program `bench tcp-failover` keeps alive.
# systemd provides systemd-analyze, which checks the packaged units, and
# hostname names the host the package test's agent registers;
# python3-yaml reads back the CLI's `--output yaml` in its test;
# etcd-server is what `bench raft-commit --peer etcd` compares with (on a
# machine booted with systemd the package also starts its own etcd on
# localhost:2379; the bench starts separate members on free ports and does
# not use it: `systemctl disable --now etcd` stops it).
# e2fsprogs (mkfs.ext4, e2fsck) and util-linux (losetup, fsfreeze, mount)
# build and break the test disks of `scenario disk-faults`.
PACKAGES=(build-essential pkg-config iproute2 python3 passwd
  libibverbs-dev librdmacm-dev libclang-dev libclang-common-14-dev
  python3-pytest python3-torch iperf3 systemd hostname python3-yaml
  etcd-server e2fsprogs util-linux mount)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done
