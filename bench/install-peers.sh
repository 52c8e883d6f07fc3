#!/usr/bin/env bash
# Installs the peers the benchmark compares against, outside the repository:
#   rathole 0.5.0 (crates.io) and frp 0.71.0 frps/frpc (Go module proxy);
#   for the file-transfer benchmark (`files`): openssh-server, rsync and GNU time (Debian),
#   croc v10 (Go module proxy) and sendme (crates.io).
# Everything goes under ${WARREN_BENCH_HOME:-$HOME/.cache/warren-bench}; nothing here
# is committed. Already-installed peers are skipped.
set -euo pipefail

BENCH_HOME="${WARREN_BENCH_HOME:-$HOME/.cache/warren-bench}"
RATHOLE_VERSION=0.5.0
FRP_VERSION=v0.71.0
CROC_VERSION=v10.7.0
SENDME_VERSION=0.37.1
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

# Debian packages for the file benchmark: sshd + scp, rsync, GNU time (peak RSS).
install_files_debian() {
    local missing=()
    [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
    command -v scp >/dev/null || missing+=(openssh-client)
    command -v rsync >/dev/null || missing+=(rsync)
    [[ -x /usr/bin/time ]] || missing+=(time)
    ((${#missing[@]})) || return 0
    local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
    echo "bench: installing ${missing[*]} (Debian packages)" >&2
    # policy-rc.d: the package must not start (or enable) the system's sshd.
    local policy=/usr/sbin/policy-rc.d created=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"; created=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
        $sudo apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    } || { ((created)) && $sudo rm -f "$policy"; return 1; }
    ((created)) && $sudo rm -f "$policy"
    return 0
}

install_croc() {
    local bin="$BENCH_HOME/bin/croc"
    if [[ -x "$bin" && -f "$bin.loopback" ]] && "$bin" --version 2>/dev/null | grep -q "${CROC_VERSION}"; then
        return 0
    fi
    command -v go >/dev/null || { echo "bench: go is needed to build croc" >&2; return 1; }
    echo "bench: building croc $CROC_VERSION into $BENCH_HOME (takes ~1 minute)" >&2
    local scratch="$BENCH_HOME/croc-module"
    rm -rf "$scratch"; mkdir -p "$scratch"
    (
        cd "$scratch"
        export GOFLAGS=-mod=mod
        go mod init scratch >/dev/null 2>&1
        go get "github.com/schollz/croc/v10@$CROC_VERSION"
        # croc prints its version from cli.Version (set by its release build). Its models
        # package resolves DEFAULT_RELAY / DEFAULT_RELAY6 (croc.schollz.com, croc6...) with
        # DNS in init(), before any flag is read; IP literals here make that lookup local,
        # so this build never sends a packet off the machine (the benchmark also passes
        # --relay / --ip 127.0.0.1:PORT and --no-local: no multicast discovery).
        local m=github.com/schollz/croc/v10/src
        go build -ldflags "-X $m/cli.Version=$CROC_VERSION -X $m/models.DEFAULT_RELAY=127.0.0.1 -X $m/models.DEFAULT_RELAY6=::1" \
            -o "$bin" github.com/schollz/croc/v10
    )
    touch "$bin.loopback"  # marks a build with the loopback defaults above
}

install_sendme() {
    local bin="$BENCH_HOME/bin/sendme"
    if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "$SENDME_VERSION"; then
        return 0
    fi
    echo "bench: installing sendme $SENDME_VERSION into $BENCH_HOME (takes several minutes)" >&2
    CARGO_TARGET_DIR="$BENCH_HOME/sendme-target" \
        cargo install sendme --version "$SENDME_VERSION" --locked --root "$BENCH_HOME/sendme" --quiet
    ln -sf "$BENCH_HOME/sendme/bin/sendme" "$bin"
    rm -rf "$BENCH_HOME/sendme-target"
}

what="${1:-all}"
case "$what" in
    rathole) install_rathole ;;
    frp) install_frp ;;
    croc) install_croc ;;
    sendme) install_sendme ;;
    files-debian) install_files_debian ;;
    files) install_files_debian; install_croc; install_sendme ;;
    all) install_rathole; install_frp ;;
    *) echo "usage: $0 [all|rathole|frp|files|files-debian|croc|sendme]" >&2; exit 2 ;;
esac
