#!/bin/sh
# retcon-sandbox in its compose container: run as the owner of the mounted repository, never as
# root, so the files a run leaves in .git/retcon-sandbox stay usable by later runs on the host.
# The engine's socket is reached through its group. A container started with --user already
# runs as someone: then nothing changes.
set -eu
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
    exec setpriv --reuid="$owner" --regid="$group" --groups="$groups" --inh-caps=-all \
        --no-new-privs retcon-sandbox "$@"
fi
exec retcon-sandbox "$@"
