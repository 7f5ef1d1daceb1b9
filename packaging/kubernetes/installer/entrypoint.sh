#!/bin/sh
# The node installer's entrypoint (DaemonSet chalk-shim-installer, image built by
# packaging/kubernetes/build-installer-image). The node's root is mounted at /host. It copies
# the shim, chalkctl and chalk-agent to /host/usr/local/bin, the installer and manifests to
# /host/usr/local/share/chalk-shim, the runtime options to /host/etc/containerd/chalk.toml if
# there are none, then registers the runtime with the node's own bash and containerd config
# (`install.sh --config-only`, chrooted) and, with RESTART_CONTAINERD=true, restarts
# containerd. Then it sleeps, as a DaemonSet pod must. Everything it does is idempotent.
set -eu
host=${HOST_ROOT:-/host}
src=/opt/chalk
say() { echo "chalk-installer: $*"; }

copy() { # copy SRC DEST MODE, atomically, only when it differs
    if ! cmp -s "$1" "$2" 2>/dev/null; then
        mkdir -p "$(dirname "$2")"
        cp "$1" "$2.chalk-new"
        chmod "$3" "$2.chalk-new"
        mv "$2.chalk-new" "$2"
        say "installed $2"
    fi
}

copy "$src/containerd-shim-chalk-v1" "$host/usr/local/bin/containerd-shim-chalk-v1" 0755
copy "$src/chalkctl" "$host/usr/local/bin/chalkctl" 0755
# The node agent (packaging/kubernetes/agent.yaml runs it on the host).
copy "$src/chalk-agent" "$host/usr/local/bin/chalk-agent" 0755
for f in install.sh chalk.toml runtimeclass.yaml; do
    copy "$src/$f" "$host/usr/local/share/chalk-shim/$f" 0644
done
chmod 0755 "$host/usr/local/share/chalk-shim/install.sh"
if [ -e "$host/etc/containerd/chalk.toml" ]; then
    say "kept /etc/containerd/chalk.toml"
else
    copy "$src/chalk.toml" "$host/etc/containerd/chalk.toml" 0644
    # As install.sh: with a node runsc from 2024 on, pods get their CNI network.
    case "$(chroot "$host" runsc help checkpoint 2>&1)" in
        *save-restore-exec-argv*)
            sed -i 's/^network = "none"$/network = "sandbox"/' "$host/etc/containerd/chalk.toml"
            say "network = \"sandbox\": pods get their CNI network" ;;
    esac
fi
if [ "${REGISTER_RUNTIME:-true}" = true ]; then
    chroot "$host" /usr/local/share/chalk-shim/install.sh --config-only
    if [ "${RESTART_CONTAINERD:-false}" = true ]; then
        chroot "$host" systemctl restart containerd && say "restarted containerd"
    else
        say "restart containerd on this node to use the runtime (or set RESTART_CONTAINERD=true)"
    fi
fi
say "done on $(cat "$host/etc/hostname" 2>/dev/null || echo this node)"
touch /tmp/installed
while :; do sleep 3600; done
