#!/usr/bin/env bash
# A tmux session for working with a Marin cluster (read this before running it):
#   window "dashboard": `marin cluster --cluster NAME dashboard`, the SSH port-forward of the
#                       cluster's dashboard to localhost:PORT (keep it running)
#   window "shell":     a shell with Ray's token variables (`marin cluster ... auth-env`) and
#                       RAY_ADDRESS set, so `ray job ...` and `ray_run` reach that cluster
# Usage: infra/marin-tmux.sh [--cluster NAME] [--port PORT] [--session NAME] [--detach] [--dry-run]
#   NAME: $MARIN_CLUSTER, else us-central2. PORT: 8265. Session: marin-NAME (attached if it exists).
#   --dry-run prints the tmux commands instead of running them; --detach does not attach.
#   Commands run through `uv run marin` ($MARIN overrides it, e.g. MARIN="python -m marin.cli").
set -euo pipefail
cd "$(dirname "$0")/.."

cluster="${MARIN_CLUSTER:-us-central2}"
port=8265
session=""
dry_run=0
detach=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cluster) cluster="$2"; shift 2 ;;
        --cluster=*) cluster="${1#*=}"; shift ;;
        --port) port="$2"; shift 2 ;;
        --port=*) port="${1#*=}"; shift ;;
        --session) session="$2"; shift 2 ;;
        --session=*) session="${1#*=}"; shift ;;
        --detach) detach=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "marin-tmux.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
session="${session:-marin-$cluster}"
marin="${MARIN:-uv run marin}"

dashboard="$marin cluster --cluster $cluster dashboard --port $port || read -r -p 'The dashboard forward stopped (see above); Enter closes this window. '"
# auth-env prints the token variables (and, for the local cluster, its own RAY_ADDRESS, which wins)
shell="export RAY_ADDRESS=http://127.0.0.1:$port; eval \"\$($marin cluster --cluster $cluster auth-env)\"; exec \"\${SHELL:-bash}\""

run() {
    if [ "$dry_run" = 1 ]; then
        printf '%q ' "$@" | sed 's/ $//'
        echo
    else
        "$@"
    fi
}

if [ "$dry_run" = 0 ]; then
    command -v tmux >/dev/null 2>&1 || { echo "marin-tmux.sh: tmux not found on PATH (apt-get install tmux / brew install tmux)" >&2; exit 2; }
fi
if [ "$dry_run" = 1 ] || ! tmux has-session -t "=$session" 2>/dev/null; then
    run tmux new-session -d -s "$session" -n dashboard "$dashboard"
    run tmux new-window -t "=$session" -n shell "$shell"
fi
if [ "$detach" = 1 ]; then
    [ "$dry_run" = 1 ] || echo "tmux session $session is running: tmux attach -t $session"
elif [ -n "${TMUX:-}" ]; then
    run tmux switch-client -t "=$session"
else
    run tmux attach-session -t "=$session"
fi
