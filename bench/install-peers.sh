#!/usr/bin/env bash
# Installs the peers the benchmark compares against, outside the repository:
#   rathole 0.5.0 (crates.io) and frp 0.71.0 frps/frpc (Go module proxy).
# Everything goes under ${WARREN_BENCH_HOME:-$HOME/.cache/warren-bench}; nothing here
# is committed. Already-installed peers are skipped.
set -euo pipefail

BENCH_HOME="${WARREN_BENCH_HOME:-$HOME/.cache/warren-bench}"
RATHOLE_VERSION=0.5.0
FRP_VERSION=v0.71.0
mkdir -p "$BENCH_HOME/bin"

install_rathole() {
    local bin="$BENCH_HOME/bin/rathole"
    if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "$RATHOLE_VERSION"; then
        return 0
    fi
    echo "bench: installing rathole $RATHOLE_VERSION into $BENCH_HOME (takes ~3 minutes)" >&2
    # No --locked: rathole's own lock file pins `time 0.3.29`, which no longer compiles.
    CARGO_TARGET_DIR="$BENCH_HOME/rathole-target" \
        cargo install rathole --version "$RATHOLE_VERSION" --root "$BENCH_HOME/rathole" --quiet
    ln -sf "$BENCH_HOME/rathole/bin/rathole" "$bin"
    rm -rf "$BENCH_HOME/rathole-target"
}

install_frp() {
    if [[ -x "$BENCH_HOME/bin/frps" && -x "$BENCH_HOME/bin/frpc" ]] \
        && "$BENCH_HOME/bin/frps" --version 2>/dev/null | grep -q "${FRP_VERSION#v}"; then
        return 0
    fi
    command -v go >/dev/null || { echo "bench: go is needed to build frp" >&2; return 1; }
    echo "bench: building frp $FRP_VERSION into $BENCH_HOME (takes ~1 minute)" >&2
    local scratch="$BENCH_HOME/frp-module"
    rm -rf "$scratch"; mkdir -p "$scratch"
    (
        cd "$scratch"
        export GOFLAGS=-mod=mod
        go mod init scratch >/dev/null 2>&1
        # `go install ...@version` is refused by the proxy here; a scratch module works.
        go get "github.com/fatedier/frp/cmd/frps@$FRP_VERSION" "github.com/fatedier/frp/cmd/frpc@$FRP_VERSION"
        # noweb: the published module lacks the dashboard assets.
        go build -tags noweb -o "$BENCH_HOME/bin/frps" github.com/fatedier/frp/cmd/frps
        go build -tags noweb -o "$BENCH_HOME/bin/frpc" github.com/fatedier/frp/cmd/frpc
    )
}

what="${1:-all}"
case "$what" in
    rathole) install_rathole ;;
    frp) install_frp ;;
    all) install_rathole; install_frp ;;
    *) echo "usage: $0 [all|rathole|frp]" >&2; exit 2 ;;
esac
