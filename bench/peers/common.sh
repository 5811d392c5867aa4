# Shared helpers for the peer scripts. Sourced, not run.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${BENCH_WORK:-$BENCH_DIR/.work}"
mkdir -p "$WORK"

# Installs Debian packages that are missing; no prompts. Needs root.
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Prints a free TCP port on 127.0.0.1 (the kernel picks it).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Waits until 127.0.0.1:$1 accepts connections, up to $2 seconds.
wait_port() {
    local port=$1 secs=${2:-60} i
    for ((i = 0; i < secs * 10; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$port after ${secs}s" >&2
    return 1
}

# Stops the process whose pid is in file $1 (if any), waiting for it to exit.
stop_pidfile() {
    local f=$1 pid i
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$f"
}
