#!/usr/bin/env bash
# Side-by-side benchmark: Warren against rathole 0.5.0 and frp 0.71.0 on this machine,
# everything on 127.0.0.1. Installs what is missing, builds Warren, measures, and (for a
# full run) writes bench/RESULTS.md and README.md's Benchmarks section. See bench/README.md.
#
#   bench/run.sh                      # full run: 15 configs x 3 runs (~25 minutes)
#   bench/run.sh --smoke              # a few seconds: Warren only, no peers, no files written
#   bench/run.sh --runs 1 --only warren-aes128,rathole-tcp   # quick look, no files but the JSON
#   bench/run.sh --netns --runs 1     # as root: across a 1500-byte veth between two network
#                                     # namespaces (writes RESULTS.md's section for it)
#   bench/run.sh --http [--runs N]    # HTTP services (issue 15): nginx direct, frp vhost,
#                                     # Warren HTTP rows (~12 minutes for 3 runs); writes
#                                     # bench/results/http-DATE.json and RESULTS.md's section
#   bench/run.sh --http --smoke       # ~15 s: direct + Warren HTTP, writes nothing; exits
#                                     # non-zero if Warren's HTTP path returns no 200s
#   bench/run.sh --files [--runs N]   # file transfer (issue 17): Warren send/receive direct and
#                                     # relayed, scp, rsync, croc, sendme (~15-20 minutes);
#                                     # writes bench/results/files-DATE.json, RESULTS.md's section
#   bench/run.sh --files --smoke      # ~10 s: Warren only, direct + relayed, one small tree,
#                                     # bytes verified by hash; non-zero exit on failure
#   bench/run.sh --wan [--runs N]     # as root, across the WAN lab (issue 44): profiles W1-W4,
#                                     # Warren's transports, rathole, frp, files, fairness
#                                     # (~2.5 hours for 3 runs); writes bench/results/wan-DATE.json,
#                                     # RESULTS.md's WAN section and README.md's WAN table
#   bench/run.sh --wan --smoke        # ~40 s: W2, no tunnel + Warren default, one small tree
#                                     # checked by hash; non-zero exit if Warren moved nothing
#   bench/run.sh --help               # every option of bench/bench.py run
set -euo pipefail
cd "$(dirname "$0")/.."

# The WAN benchmark (bench/wan.py, issue 44) has its own options too.
for arg in "$@"; do
    if [[ "$arg" == --wan ]]; then
        args=(); smoke=0; write=1; only=""; files=""
        while (($#)); do
            case "$1" in
                --wan) ;;
                --smoke) smoke=1; args+=("$1") ;;
                --only) write=0; only="$2"; args+=("$1" "$2"); shift ;;
                --only=*) write=0; only="${1#--only=}"; args+=("$1") ;;
                --files) files="$2"; args+=("$1" "$2"); shift ;;
                --files=*) files="${1#--files=}"; args+=("$1") ;;
                --no-write) write=0 ;;
                -h|--help) exec python3 bench/wan.py run --help ;;
                *) args+=("$1") ;;
            esac
            shift
        done
        [[ $(id -u) == 0 ]] || { echo "bench: --wan needs root (network namespaces, TUN devices)" >&2; exit 1; }
        if [[ -n "${WARREN_BIN:-}" ]]; then
            args+=(--warren "$WARREN_BIN")
            cargo build --release --quiet -p wanlab
        else
            cargo build --release --quiet -p warren -p wanlab
        fi
        command -v iperf3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
        [[ -x /usr/bin/time ]] || bench/install-peers.sh files-debian
        if ((!smoke)); then
            if [[ -z "$only" || "$only" == *rathole* ]]; then bench/install-peers.sh rathole; fi
            if [[ -z "$only" || "$only" == *frp* ]]; then bench/install-peers.sh frp; fi
            if [[ -z "$files" || "$files" == *scp* || "$files" == *rsync* ]]; then
                bench/install-peers.sh files-debian
            fi
            if [[ -z "$files" || "$files" == *croc* ]]; then
                bench/install-peers.sh croc || echo "bench: croc could not be installed; files without it" >&2
            fi
        fi
        ((smoke || !write)) || args+=(--write-results)
        exec python3 bench/wan.py run "${args[@]}"
    fi
done

# The file-transfer benchmark (bench/files.py, issue 17) has its own options too.
for arg in "$@"; do
    if [[ "$arg" == --files ]]; then
        args=(); smoke=0; write=1; only=""
        while (($#)); do
            case "$1" in
                --files) ;;
                --smoke) smoke=1; args+=("$1") ;;
                --only) write=0; only="$2"; args+=("$1" "$2"); shift ;;
                --only=*) write=0; only="${1#--only=}"; args+=("$1") ;;
                --no-write) write=0 ;;
                -h|--help) exec python3 bench/files.py run --help ;;
                *) args+=("$1") ;;
            esac
            shift
        done
        if [[ -n "${WARREN_BIN:-}" ]]; then
            args+=(--warren "$WARREN_BIN")
        else
            cargo build --release --quiet -p warren
        fi
        [[ -x /usr/bin/time ]] || bench/install-peers.sh files-debian
        if ((!smoke)); then
            if [[ -z "$only" || "$only" == *scp* || "$only" == *rsync* ]]; then
                bench/install-peers.sh files-debian
            fi
            if [[ -z "$only" || "$only" == *croc* ]]; then bench/install-peers.sh croc; fi
            if [[ -z "$only" || "$only" == *sendme* ]]; then bench/install-peers.sh sendme; fi
        fi
        ((smoke || !write)) || args+=(--write-results)
        exec python3 bench/files.py run "${args[@]}"
    fi
done

# The HTTP benchmark (bench/http_bench.py) has its own options; it installs nginx, wrk and
# h2load itself (Debian packages, only if missing).
for arg in "$@"; do
    if [[ "$arg" == --http ]]; then
        args=(); smoke=0; write=1
        for a in "$@"; do
            case "$a" in
                --http) ;;
                --smoke) smoke=1; args+=("$a") ;;
                --only|--only=*) write=0; args+=("$a") ;;
                --no-write) write=0 ;;
                -h|--help) exec python3 bench/http_bench.py run --help ;;
                *) args+=("$a") ;;
            esac
        done
        if [[ -n "${WARREN_BIN:-}" ]]; then
            args+=(--warren "$WARREN_BIN")
        else
            cargo build --release --quiet -p warren
        fi
        ((smoke)) || bench/install-peers.sh frp
        ((smoke || !write)) || args+=(--write-results)
        exec python3 bench/http_bench.py run "${args[@]}"
    fi
done

smoke=0; netns=0; only=""; write=1; passthrough=()
while (($#)); do
    case "$1" in
        --smoke) smoke=1; passthrough+=("$1") ;;
        --netns) netns=1; passthrough+=("$1") ;;
        --only) only="$2"; passthrough+=("$1" "$2"); shift ;;
        --only=*) only="${1#--only=}"; passthrough+=("$1") ;;
        --no-write) write=0 ;;
        -h|--help) sed -n '2,16p' "$0"; echo; exec python3 bench/bench.py run --help ;;
        *) passthrough+=("$1") ;;
    esac
    shift
done
[[ -n "$only" || $smoke == 1 ]] && write=0

# 1000 idle connections through a tunnel need a few thousand descriptors per process.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [[ "$(ulimit -n)" != unlimited && "$(ulimit -n)" -lt 8192 ]]; then
    echo "bench: warning: ulimit -n is $(ulimit -n); the idle-connection figure may fail" >&2
fi

apt_install() {
    local missing=()
    for pkg in "$@"; do command -v "$pkg" >/dev/null || missing+=("$pkg"); done
    ((${#missing[@]})) || return 0
    local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
    echo "bench: installing ${missing[*]} (Debian packages)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
        $sudo apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    }
}
if ((smoke)); then
    apt_install iperf3
    apt_install sockperf || echo "bench: sockperf could not be installed; smoke skips the RTT" >&2
else
    apt_install iperf3 sockperf
fi

if [[ -n "${WARREN_BIN:-}" ]]; then
    passthrough+=(--warren "$WARREN_BIN")
else
    cargo build --release --quiet -p warren
fi

if ((!smoke)); then
    # --netns without --only runs no rathole config (bench.py's NETNS_CONFIGS).
    if [[ "$only" == *rathole* ]] || [[ -z "$only" && $netns == 0 ]]; then
        bench/install-peers.sh rathole
    fi
    if [[ -z "$only" || "$only" == *frp* ]]; then bench/install-peers.sh frp; fi
fi

((write)) && passthrough+=(--write-results)
# bench.py stops every process it started (by PID) on exit, error or signal.
exec python3 bench/bench.py run "${passthrough[@]}"
