#!/usr/bin/env bash
# The one test command: formatting, lints, unit and integration tests, then the end-to-end
# tests against the release binary. CI runs it through .ci/run.
#
# On a fresh Debian machine it first installs what is missing (iperf3, dnsmasq-base,
# dnsutils, microsocks, tinyproxy and haproxy via apt-get; the rustfmt and clippy
# components via rustup); on a machine that has everything it installs nothing. Usage: scripts/test.sh
set -euo pipefail

cd "$(dirname "$0")/.."

banner() {
    printf '\n==> %s\n' "$*"
}

# Runs a command as root: directly when we are root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

banner "1/5 tools"
missing_packages=()
command -v iperf3 >/dev/null 2>&1 || missing_packages+=(iperf3)
command -v dnsmasq >/dev/null 2>&1 || missing_packages+=(dnsmasq-base)
command -v dig >/dev/null 2>&1 || missing_packages+=(dnsutils)
command -v sockperf >/dev/null 2>&1 || missing_packages+=(sockperf)
command -v microsocks >/dev/null 2>&1 || missing_packages+=(microsocks)
command -v tinyproxy >/dev/null 2>&1 || missing_packages+=(tinyproxy)
command -v haproxy >/dev/null 2>&1 || missing_packages+=(haproxy)
if [ "${#missing_packages[@]}" -gt 0 ]; then
    echo "installing: ${missing_packages[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing_packages[@]}"
else
    echo "have: iperf3 dnsmasq dig sockperf microsocks tinyproxy haproxy"
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "installing the rustup component $component"
        rustup component add "$component"
    fi
done
cargo --version

banner "2/5 cargo fmt --all -- --check"
cargo fmt --all -- --check

banner "3/5 cargo clippy --all-targets --locked -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings

banner "4/5 cargo test --locked (debug: unit, integration, doc tests)"
cargo test --locked

banner "5/5 release build and end-to-end tests (real binary with iperf3, dnsmasq, dig, microsocks, tinyproxy, haproxy)"
cargo build --release --locked
WARREN_E2E_REQUIRE_TOOLS=1 cargo test --release --locked -p warren --test e2e --test e2e_dns --test e2e_ops --test e2e_proxy

banner "benchmark smoke (bench/run.sh --smoke: the harness still measures a working tunnel)"
bash bench/run.sh --smoke

echo
echo "test.sh: all checks passed"
