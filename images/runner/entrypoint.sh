#!/bin/sh
# retcon-sandbox in its compose container: run as the owner of the mounted repository, never as
# root, so the files a run leaves in .git/retcon-sandbox stay usable by later runs on the host.
# The engine's socket is reached through its group. What a run keeps outside the repository
# (the notes key, crash logs) goes to /state/<uid>, on compose's named volume, so the next
# container finds it. A container started with --user already runs as someone: then nothing
# changes.
set -eu
case "${DOCKER_HOST:-}" in
    # a socket on the host: here it is the one compose mounts (DOCKER_SOCK)
    unix://*) export DOCKER_HOST=unix:///var/run/docker.sock ;;
esac
if [ "$(id -u)" = 0 ]; then
    owner=$(stat -c %u /repo)
    group=$(stat -c %g /repo)
    if [ "$owner" = 0 ]; then
        echo "retcon-sandbox: the repository mounted at /repo belongs to root; refusing to run" \
             "as root. Mount a repository you own (REPO=/path/to/repo)." >&2
        exit 1
    fi
    groups=$group
    socket=${DOCKER_HOST:-unix:///var/run/docker.sock}
    socket=${socket#unix://}
    if [ -S "$socket" ]; then
        groups="$groups,$(stat -c %g "$socket")"
    fi
    export HOME=/tmp
    if [ -d /state ]; then
        # the owner's own folder, made by root and handed over (the key's folder must be
        # the user's and closed to others); a link or a file in its place is replaced
        state=/state/$owner
        if [ -L "$state" ] || { [ -e "$state" ] && [ ! -d "$state" ]; }; then
            rm -f "$state"
        fi
        mkdir -p "$state"
        chown "$owner:$group" "$state"
        chmod 700 "$state"
        export HOME="$state" XDG_STATE_HOME="$state"
    fi
    exec setpriv --reuid="$owner" --regid="$group" --groups="$groups" --inh-caps=-all \
        --no-new-privs retcon-sandbox "$@"
fi
exec retcon-sandbox "$@"
