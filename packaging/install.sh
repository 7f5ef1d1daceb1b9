#!/usr/bin/env bash
# Installs chalk-shim on a node: the shim and chalkctl, the runtime options file, and the
# `chalk` runtime in containerd's CRI config (version 2 for containerd 1.6/1.7, version 3 for
# 2.x), leaving everything else in that config as it was. Idempotent; --uninstall removes
# exactly what it added (an options file you edited stays); --dry-run shows what it would do.
#
#   packaging/install.sh [--dry-run] [--uninstall] [--config-only] [--from DIR]
#                        [--bin-dir DIR] [--config FILE] [--options FILE] [--state DIR]
#
#   --config-only   only register the runtime in containerd's config (the Debian package and
#                   the node DaemonSet install the files themselves)
#   --from DIR      where the built binaries are (default: target/release next to this
#                   script's repository, else this script's directory)
#   --bin-dir DIR   where they go (default /usr/local/bin; containerd must find the shim on
#                   its PATH)
#   --config FILE   containerd's config (default /etc/containerd/config.toml)
#   --options FILE  the runtime options file (default /etc/containerd/chalk.toml)
#   --state DIR     where the installer records what it installed (default /var/lib/chalk-shim)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dry=false uninstall=false config_only=false
from="" bin_dir=/usr/local/bin config=/etc/containerd/config.toml
options=/etc/containerd/chalk.toml state=/var/lib/chalk-shim
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=true ;;
        --uninstall) uninstall=true ;;
        --from) from=$2; shift ;;
        --bin-dir) bin_dir=$2; shift ;;
        --config) config=$2; shift ;;
        --options) options=$2; shift ;;
        --state) state=$2; shift ;;
        --config-only) config_only=true ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$from" ]; then
    if [ -x "$here/../target/release/containerd-shim-chalk-v1" ]; then
        from=$here/../target/release
    else
        from=$here
    fi
fi
binaries=(containerd-shim-chalk-v1 chalkctl)
begin="# BEGIN chalk-shim runtime (managed by chalk-shim's install.sh; --uninstall removes it)"
end="# END chalk-shim runtime"
record=$state/installed

say() { echo "install.sh: $*"; }

# The options to install: pods get their CNI network through runsc's "sandbox" network, which
# Debian 12's 2022 runsc refuses on current kernels; a runsc from 2024 on (its checkpoint has
# --save-restore-exec-argv) gets it, others keep "none" (loopback only).
options_text() {
    if grep -q -- 'save-restore-exec-argv' <<<"$(runsc help checkpoint 2>&1)"; then
        echo "install.sh: $(command -v runsc) is recent: pods get their CNI network (network = \"sandbox\")" >&2
        sed 's/^network = "none"$/network = "sandbox"/' "$here/chalk.toml"
    else
        cat "$here/chalk.toml"
    fi
}
run() { if $dry; then echo "would: $*"; else "$@"; fi; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# The config version of `file`: its `version = N`, else what the installed containerd writes.
config_version() {
    local v
    v=$(sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9]\+\).*/\1/p' "$1" 2>/dev/null | head -n1)
    if [ -n "$v" ]; then echo "$v"; return; fi
    if containerd --version 2>/dev/null | grep -q ' v\?2\.'; then echo 3; else echo 2; fi
}

# The runtime entry for config version $1.
entry() {
    local plugin
    case $1 in
        2) plugin='io.containerd.grpc.v1.cri".containerd.runtimes.chalk' ;;
        3) plugin='io.containerd.cri.v1.runtime".containerd.runtimes.chalk' ;;
        *) echo "install.sh: containerd config version $1 is not supported (2 or 3)" >&2; exit 1 ;;
    esac
    echo "$begin"
    if [ "$1" = 2 ] && ! without_block_of_config | grep -q 'containerd\.runtimes\.runc\]'; then
        # containerd 1.6/1.7 replace their default runtimes with those a config names: keep
        # runc, the default, or CRI stops loading.
        cat <<EOF
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
EOF
    fi
    cat <<EOF
[plugins."$plugin]
  runtime_type = "io.containerd.chalk.v1"
  pod_annotations = ["chalk.io/*"]
  [plugins."$plugin.options]
    TypeUrl = "io.containerd.chalk.v1.options"
    ConfigPath = "$options"
$end
EOF
}

# The config without our block (nothing when there is no config yet).
without_block_of_config() {
    if [ -f "$config" ]; then without_block "$config"; fi
}

# `file` without our block.
without_block() {
    awk -v b="$begin" -v e="$end" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' "$1"
}

# Writes `content` (stdin) to `file` unless it is already that; shows the change with --dry-run.
put() {
    local file=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat > "$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
        return
    fi
    if $dry; then
        if grep -qI . "$tmp"; then
            say "would write $file:"
            diff -u "$file" "$tmp" 2>/dev/null | sed 's/^/    /' || sed 's/^/    + /' "$tmp"
        else
            say "would install $file ($(wc -c < "$tmp") bytes, mode $mode)"
        fi
        rm -f "$tmp"
        return
    fi
    mkdir -p "$(dirname "$file")"
    install -m "$mode" "$tmp" "$file"
    rm -f "$tmp"
    say "wrote $file"
}

if $uninstall; then
    if [ -f "$config" ] && grep -qxF "$begin" "$config"; then
        without_block "$config" | put "$config" 0644
    fi
    if [ -f "$record" ]; then
        while read -r sum path; do
            [ -e "$path" ] || continue
            if [ "$sum" = config-created ]; then
                if [ "$(grep -cv '^[[:space:]]*\(#.*\)\?$' "$path")" = 1 ] && grep -q '^version' "$path"; then
                    run rm -f "$path"
                    $dry || say "removed $path (it created it)"
                fi
                continue
            fi
            if [ "$(sha "$path")" = "$sum" ]; then
                run rm -f "$path"
                $dry || say "removed $path"
            else
                say "left $path: it changed since it was installed"
            fi
        done < "$record"
        run rm -f "$record"
        run rmdir "$state" 2>/dev/null || true
    else
        say "nothing recorded in $record: no files to remove"
    fi
    say "done. Restart containerd (systemctl restart containerd) to drop the runtime."
    exit 0
fi

if ! $config_only; then
    for b in "${binaries[@]}"; do
        [ -x "$from/$b" ] || { echo "install.sh: $from/$b is missing: build it (cargo build --release) or pass --from" >&2; exit 1; }
    done
fi
if [ -f "$config" ] && without_block "$config" | grep -q 'containerd\.runtimes\.chalk\]'; then
    echo "install.sh: $config already has a runtime named chalk outside this installer's block; left alone (remove it, or register by hand)" >&2
    exit 1
fi

recorded=()
if ! $config_only; then
    for b in "${binaries[@]}"; do
        put "$bin_dir/$b" 0755 < "$from/$b"
        recorded+=("$bin_dir/$b")
    done
    if [ -f "$options" ]; then
        say "kept $options (already there)"
    else
        options_text | put "$options" 0644
        recorded+=("$options")
    fi
fi
version=$(config_version "$config")
created_config=false
[ -f "$config" ] || created_config=true
{
    if $created_config; then
        echo "version = $version"
    else
        without_block "$config"
    fi
    entry "$version"
} | put "$config" 0644
if ! $dry; then
    mkdir -p "$state"
    touch "$record"
    for path in "${recorded[@]}"; do
        grep -q " $path\$" "$record" || echo "$(sha "$path") $path" >> "$record"
    done
    # A config this installer created goes on uninstall if nothing else was added to it.
    if $created_config; then
        echo "config-created $config" >> "$record"
    fi
fi
# chalkctl's sandboxes get networks of their own through the CNI plugins (docs/networks.md).
if ! [ -x /opt/cni/bin/bridge ] && ! [ -x /usr/lib/cni/bridge ]; then
    say "note: no CNI plugins in /opt/cni/bin or /usr/lib/cni: chalkctl's sandboxes get loopback only until they are installed (Debian: apt-get install containernetworking-plugins iptables)"
fi
if grep -q 'disabled_plugins.*cri' "$config" 2>/dev/null; then
    say "warning: $config disables the CRI plugin; Kubernetes cannot use the runtime until it is enabled"
fi
cat <<EOF
install.sh: done (config version $version).
  Restart containerd:   systemctl restart containerd
  Check the runtime:    containerd config dump | grep -A3 'runtimes.chalk'
                        ctr run --rm --runtime io.containerd.chalk.v1 docker.io/library/busybox:latest t echo ok
  Kubernetes:           kubectl apply -f $here/kubernetes/runtimeclass.yaml   (handler: chalk)
EOF
