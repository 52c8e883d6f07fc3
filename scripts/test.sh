#!/usr/bin/env bash
# The one test command: formatting, lints, unit and integration tests, then the end-to-end
# tests against the release binary. CI runs it through .ci/run.
#
# On a fresh Debian machine it first installs what is missing (iperf3, iputils-ping, dnsmasq-base,
# dnsutils, microsocks, tinyproxy, haproxy, nftables, curl, wrk, nginx, chromium and openssh via apt-get; the rustfmt
# and clippy components via rustup; playwright in a venv under target/); on a machine that has
# everything it installs nothing. Usage: scripts/test.sh
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

banner "1/9 tools"
missing_packages=()
command -v iperf3 >/dev/null 2>&1 || missing_packages+=(iperf3)
command -v ping >/dev/null 2>&1 || missing_packages+=(iputils-ping)
command -v dnsmasq >/dev/null 2>&1 || missing_packages+=(dnsmasq-base)
command -v dig >/dev/null 2>&1 || missing_packages+=(dnsutils)
command -v sockperf >/dev/null 2>&1 || missing_packages+=(sockperf)
command -v microsocks >/dev/null 2>&1 || missing_packages+=(microsocks)
command -v tinyproxy >/dev/null 2>&1 || missing_packages+=(tinyproxy)
command -v haproxy >/dev/null 2>&1 || missing_packages+=(haproxy)
command -v iptables >/dev/null 2>&1 || missing_packages+=(iptables)
command -v nft >/dev/null 2>&1 || missing_packages+=(nftables)
command -v ip >/dev/null 2>&1 || missing_packages+=(iproute2)
command -v prlimit >/dev/null 2>&1 || missing_packages+=(util-linux)
command -v tshark >/dev/null 2>&1 || missing_packages+=(tshark)
command -v curl >/dev/null 2>&1 || missing_packages+=(curl)
command -v wrk >/dev/null 2>&1 || missing_packages+=(wrk)
{ command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } || missing_packages+=(nginx)
command -v chromium >/dev/null 2>&1 || missing_packages+=(chromium)
command -v scp >/dev/null 2>&1 || missing_packages+=(openssh-client)
[ -x /usr/sbin/sshd ] || missing_packages+=(openssh-server)
{ command -v conntrack >/dev/null 2>&1 || [ -x /usr/sbin/conntrack ]; } || missing_packages+=(conntrack)
if [ "${#missing_packages[@]}" -gt 0 ]; then
    echo "installing: ${missing_packages[*]}"
    # tshark asks whether non-root users may capture; answer no without a prompt.
    echo 'wireshark-common wireshark-common/install-setuid boolean false' |
        as_root debconf-set-selections 2>/dev/null || true
    # nginx's package would start a system nginx on port 80 of every address: a temporary
    # policy-rc.d keeps every package's service from starting (the tests start their own).
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing_packages[@]}"
    if [ "$made_policy" = 1 ]; then
        as_root rm -f /usr/sbin/policy-rc.d
    fi
else
    echo "have: iperf3 ping dnsmasq dig sockperf microsocks tinyproxy haproxy iptables nft ip prlimit tshark curl wrk nginx chromium scp sshd conntrack"
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "installing the rustup component $component"
        rustup component add "$component"
    fi
done
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
if ! cargo deny --version >/dev/null 2>&1; then
    echo "installing cargo-deny"
    cargo install cargo-deny --locked
fi
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "installing the nightly toolchain (for cargo fuzz)"
    rustup toolchain install nightly --profile minimal
fi
# Playwright for the dashboard's browser test, in a venv of its own. Its browser is Debian's
# chromium (above): never `playwright install`, which downloads one.
browser_venv=target/browser-venv
if ! "$browser_venv/bin/python" -c 'import playwright' >/dev/null 2>&1; then
    echo "making $browser_venv with playwright"
    rm -rf "$browser_venv"
    if ! python3 -m venv "$browser_venv" >/dev/null 2>&1; then
        # Debian's python3 makes venvs only with python3-venv.
        rm -rf "$browser_venv"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
        python3 -m venv "$browser_venv"
    fi
    "$browser_venv/bin/pip" install --quiet playwright==1.65.2
fi
cargo --version

banner "2/9 cargo fmt --all -- --check"
cargo fmt --all -- --check

banner "3/9 cargo clippy --all-targets --locked -- -D warnings; no broken links in the docs"
cargo clippy --all-targets --locked -- -D warnings
# Internal docs link private items on purpose (they are read with --document-private-items);
# a link to nothing is a mistake.
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -A rustdoc::private_intra_doc_links" \
    cargo doc --workspace --no-deps --document-private-items --locked --quiet

banner "4/9 cargo test --locked (debug: unit, integration, doc tests)"
cargo test --locked

# The transfer tests write ~5 GiB of payloads at once (a 1 GiB file sent and received, a
# tree of 1000 MiB, ...) into the temp dir: say so up front instead of failing with
# "No space left on device" in the middle of a transfer.
tmp_dir="${TMPDIR:-/tmp}"
free_kib=$(df -Pk "$tmp_dir" | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((6 * 1024 * 1024)) ]; then
    echo "error: the end-to-end tests need 6 GiB free in $tmp_dir; it has $((free_kib / 1024)) MiB." >&2
    echo "       Free some space (e.g. cargo clean in old checkouts) or point TMPDIR at a larger disk." >&2
    exit 1
fi

banner "5/9 release build and end-to-end tests (real binary with iperf3, dnsmasq, dig, microsocks, tinyproxy, haproxy; two servers and two clients behind haproxy; send/receive and p2p tunnels)"
cargo build --release --locked
WARREN_E2E_REQUIRE_TOOLS=1 cargo test --release --locked -p warren --test e2e --test e2e_dns --test e2e_ops --test e2e_proxy --test e2e_ha --test e2e_http --test e2e_files --test e2e_p2p

banner "5a/9 dashboard in a real browser (Chromium + Playwright against the release binary; screenshots in target/dashboard-screenshots/)"
"$browser_venv/bin/python" tests/browser/dashboard.py

banner "5b/9 benchmark smoke (bench/run.sh --smoke, --smoke --only warren-p2p, --http --smoke, --files --smoke: the harnesses still measure working transfers)"
bash bench/run.sh --smoke
bash bench/run.sh --smoke --only warren-p2p
bash bench/run.sh --http --smoke
bash bench/run.sh --files --smoke

banner "6/9 hostile peers and resource exhaustion (release; prints the measurements)"
cargo test --release --locked -p warren --test hostile -- --nocapture --test-threads=1

banner "7/9 faults: chaos relay, network namespaces (root, ip, iptables), the WAN lab (W2: congestion control on both ends; bench/run.sh --wan --smoke), the NAT matrix through warren send/receive, --lan with mDNS, and through P2P tunnels with ssh and dig (nft), security"
WARREN_NETNS_TESTS=1 cargo test --release --locked -p warren --test faults --test netns --test e2e_files_nat --test e2e_files_lan --test e2e_p2p_nat --test e2e_wan -- --nocapture
bash bench/run.sh --wan --smoke
WARREN_E2E_REQUIRE_TOOLS=1 cargo test --release --locked -p warren --test security -- --nocapture

banner "8/9 cargo deny (licenses, bans, sources; advisories when the database is reachable)"
if cargo deny --locked check advisories licenses bans sources 2>/tmp/warren-deny.log; then
    echo "cargo deny: all checks passed"
elif grep -qiE 'advisory-db|failed to fetch|could not resolve|github' /tmp/warren-deny.log; then
    echo "the advisory database is unreachable from here; checking licenses, bans and sources only"
    cargo deny --locked check licenses bans sources
else
    cat /tmp/warren-deny.log
    exit 1
fi

banner "9/9 fuzz smoke (nightly, ${WARREN_FUZZ_SECONDS:-10}s per target; corpus in fuzz/corpus)"
(cd fuzz && cargo +nightly fuzz build)
fuzz_scratch="$(mktemp -d)"
trap 'rm -rf "$fuzz_scratch"' EXIT
for target in $(cd fuzz && cargo +nightly fuzz list); do
    echo "fuzz: $target"
    # Run on a scratch copy of the kept corpus, so CI never grows the repository.
    mkdir -p "$fuzz_scratch/$target"
    if [ -d "fuzz/corpus/$target" ]; then
        cp -r "fuzz/corpus/$target/." "$fuzz_scratch/$target/"
    fi
    if ! (cd fuzz && cargo +nightly fuzz run "$target" "$fuzz_scratch/$target" -- \
        -max_total_time="${WARREN_FUZZ_SECONDS:-10}" -max_len=4096 >"$fuzz_scratch/$target.log" 2>&1); then
        tail -n 40 "$fuzz_scratch/$target.log"
        echo "fuzz target $target failed (crash input in fuzz/artifacts/$target/)"
        exit 1
    fi
    grep -E '^Done|stat::number_of_executed_units' "$fuzz_scratch/$target.log" | tail -n 1
done

echo
echo "test.sh: all checks passed"
