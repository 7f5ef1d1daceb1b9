//! Every key chalk-shim writes or reads on containerd's records, OCI specs and snapshot
//! artifacts. Other programs (chalk-web, a Kubernetes node, scripts) read these: they are a
//! contract, so they are named once, here. Each says who writes it and who reads it.
//!
//! - *Spec annotations* are set by whoever creates a container (a user, chalkctl, CRI from a
//!   pod's annotations) and read by the shim at Create.
//! - *Container labels* are on containerd's container records.
//! - *Record labels* are on the snapshot records chalk keeps in containerd's image store.
//! - *Artifact annotations* are in a stored snapshot's OCI manifest.

// Spec annotations.

/// How long the sandbox may run, counted from each start (a fresh start, a fork, a resume).
/// Written by users (`chalkctl run --lifetime`); read by the shim.
pub const LIFETIME_ANNOTATION: &str = "chalk.io/lifetime";
/// `destroy` (the default) or `suspend`: what ends a lifetime. Written by users; read by the
/// shim.
pub const ON_TIMEOUT_ANNOTATION: &str = "chalk.io/on-timeout";
/// A JSON array of hooks run around a checkpoint and in each restore (only `place =
/// "sandbox"`, and only where the runtime options allow it). Written by users; read by the
/// shim's hooks runner.
pub const HOOKS_ANNOTATION: &str = "chalk.io/hooks";
/// `"true"` marks a GPU sandbox (beside NVIDIA devices in its spec or runsc's nvproxy).
/// Written by users; read by the shim, which hands the GPU over around a checkpoint.
pub const GPU_ANNOTATION: &str = "chalk.io/gpu";
/// On a fork's containers: the id of the pod the snapshot was taken from. Written by chalkctl's
/// fork; read by the shim, which copies that pod's bind-mounted files (hosts, resolv.conf,
/// shm...) for the fork instead of sharing them with the source.
pub const PRIVATE_MOUNTS_OF: &str = "chalk.io/private-mounts-of";
/// On a pod: the snapshot its sandbox and containers start from, `sha256:<digest>` (in the
/// node's store) or `REF@sha256:<digest>` (in a registry). Written by users, the node agent or
/// a controller's pod template; reaches the shim through CRI (`pod_annotations`), which restores
/// the pod from it where the runtime options' `[restore_from]` allow.
pub const RESTORE_FROM: &str = "chalk.io/restore-from";
/// On a pod: the snapshot a suspended sandbox resumes from, in the same forms as
/// [`RESTORE_FROM`], which it overrides. Written by the node agent when it suspends an
/// agent-sandbox Sandbox (into its pod template, or its claim's pod metadata) and cleared once
/// the pod has resumed; a template's own `restore-from` (a warm pool's golden snapshot) is
/// left alone. Read by the shim as `restore-from` is.
pub const RESUME_FROM: &str = "chalk.io/resume-from";
/// On a task Update: `arm` holds the stop signals of a pod's containers (a kill other than
/// SIGKILL is answered but not delivered), `release` delivers them, `kill` delivers SIGKILL
/// instead (the pod was snapshotted: nothing may run after it). Written by the node agent
/// around a suspend; read by the shim.
pub const HOLD_STOP: &str = "chalk.io/hold-stop";
/// The CNI network a sandbox is attached to (`none`, or absent: loopback only). Written by
/// chalkctl (`run --net`, and kept by `fork` and `resume`) and chalk-web; read by the shim,
/// which attaches the sandbox's own network namespace to it at Create and detaches it when
/// the sandbox ends.
pub const NETWORK_ANNOTATION: &str = "chalk.io/network";
/// Published ports, comma-separated `[HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp]`. Written by
/// chalkctl (`-p`; a fork's are dropped unless given again); read by the shim, which hands
/// them to the network's portmap plugin.
pub const PORTS_ANNOTATION: &str = "chalk.io/ports";
/// `"true"` when [`NETWORK_ANNOTATION`] is chalkctl's default rather than asked for: where
/// this host cannot give the sandbox that network (its runsc, or no CNI plugins), the shim
/// runs it with loopback only and says why in [`NO_NETWORK_LABEL`]. Written by chalkctl;
/// read by the shim.
pub const NETWORK_DEFAULT_ANNOTATION: &str = "chalk.io/network-default";

// Container labels.

/// On a pod sandbox container's record: the agent-sandbox Sandbox whose suspend is being
/// taken. Written by the node agent just before it snapshots a pod (the Sandbox's name, or
/// empty for any other snapshot it takes); read by the shim, which records it in the
/// snapshot's owner. A pod's own labels reach containerd's records too, so only the agent's
/// write just before its snapshot counts.
pub const OWNER_SANDBOX_LABEL: &str = "chalk.io/owner-sandbox";

/// When a sandbox's lifetime ends (RFC 3339, UTC). Written by the shim when the sandbox
/// starts; read by chalkctl (`ls`, `get`) and chalk-web.
pub const EXPIRES_AT_LABEL: &str = "chalk.io/expires-at";
/// A sandbox's addresses on its network, comma-separated. Written by the shim once the
/// network is attached; read by chalkctl (`get`, `ls`) and chalk-web.
pub const ADDRESS_LABEL: &str = "chalk.io/address";
/// Why a sandbox has loopback only although chalkctl's default network was asked for.
/// Written by the shim; read by chalkctl (`run`, `get`).
pub const NO_NETWORK_LABEL: &str = "chalk.io/no-network-because";
/// A sandbox's name, unique in its namespace. Written by chalkctl (`run --name`, `fork
/// --name`); read by chalkctl to resolve names and by chalk-web.
pub const NAME_LABEL: &str = "chalk.io/name";
/// On a fork: the snapshot it came from (its parent snapshot); absent on a fork of a running
/// sandbox made from a checkpoint never kept (`chalkctl fork --id`), whose lineage is its
/// parent sandbox alone. Written by chalkctl's fork; read by chalkctl's tree and listings and
/// by chalk-web.
pub const FORKED_FROM: &str = "chalk.io/forked-from";
/// On a fork: the sandbox its snapshot was taken of. Written by chalkctl's fork; read by
/// chalkctl's tree.
pub const PARENT_SANDBOX: &str = "chalk.io/parent-sandbox-id";
/// On a resumed sandbox: the snapshot it resumed from. Written by chalkctl's resume; read by
/// chalkctl's listings and tree.
pub const RESUMED_FROM: &str = "chalk.io/resumed-from";
/// On a suspended sandbox's record: the snapshot holding it. Written by chalkctl's suspend;
/// read by resume, `ls --all` and chalk-web.
pub const SUSPENDED_FROM: &str = "chalk.io/suspended-from";
/// On a sandbox the shim ended itself: why (its memory could not be fetched, say). Written
/// by the shim; read by chalkctl's `inspect`, `wait` and listings.
pub const ENDED_BECAUSE: &str = "chalk.io/ended-because";
/// On a suspended sandbox moved to another host: where it went. Written by chalkctl's move;
/// read by chalkctl's listings.
pub const RELEASED_TO: &str = "chalk.io/released-to";
/// Marks a container whose stdio chalkctl keeps; its forks and resumes get a keeper too.
/// Written by chalkctl (`run`, `fork`, `resume`); read by chalkctl.
pub const STDIO_LABEL: &str = "chalk.io/stdio";
/// Marks the sandboxes chalk-web started, so that it removes only its own. Written and read by
/// chalk-web.
pub const WEB_OWNER_LABEL: &str = "chalk.io/web";

// Snapshot record labels (records are images named `chalk.io/snapshots/<sandbox>:<stamp>`).

/// The prefix of every snapshot record's image name.
pub const RECORD_PREFIX: &str = "chalk.io/snapshots/";
/// Marks an image as a snapshot record. Written by chalkctl and the shim's lifetime suspend;
/// read by every listing (chalkctl, chalk-web).
pub const LABEL_SNAPSHOT: &str = "chalk.io/snapshot";
/// The sandbox a snapshot was taken of. Written with the record; read by listings and filters.
pub const LABEL_SANDBOX: &str = "chalk.io/sandbox-id";
/// `in-progress`, `completed` or `failed`. Written by whoever takes the snapshot; read by
/// listings, fork and resume (only completed snapshots restore).
pub const LABEL_STATUS: &str = "chalk.io/status";
/// Why a snapshot failed. Written with status `failed`; read by listings.
pub const LABEL_ERROR: &str = "chalk.io/error";
/// When the snapshot was begun (RFC 3339). Written with the record; read by listings (order,
/// pages).
pub const LABEL_CREATED: &str = "chalk.io/created";
/// The snapshot's id: its artifact's digest in the shim's store. Written when completed; read
/// by `--snapshot-id` lookups and the web pages.
pub const LABEL_ID: &str = "chalk.io/snapshot-id";
/// The image the sandbox's root filesystem came from. Written with the record; read by fork,
/// resume and push.
pub const LABEL_BASE: &str = "chalk.io/base-image";
/// The process taking an in-progress snapshot (pid and start time), so that another can tell
/// a live taker from a dead one. Written by chalkctl; read by chalkctl's settling.
pub const LABEL_OWNER: &str = "chalk.io/owner";
/// The prefix of user labels on a record (`--label k=v` becomes `chalk.io/label.k`). Written
/// by chalkctl; read by filters.
pub const USER_PREFIX: &str = "chalk.io/label.";
/// On the record's index: when the checkpoint was taken. Written by chalkctl; read by
/// listings.
pub const CHECKPOINTED_AT: &str = "chalk.io/checkpointed-at";

// Snapshot artifact annotations (the OCI manifest in the shim's store and in registries).

/// The snapshotter the sandbox's root filesystem was on. Written by the shim at checkpoint;
/// read by fork and resume to prepare the new root.
pub const SNAPSHOTTER_ANNOTATION: &str = "io.chalk.snapshot.snapshotter";
/// The media type of the container spec carried in the artifact. Written by the shim; read by
/// fork and resume.
pub const SPEC_TYPE_ANNOTATION: &str = "io.chalk.snapshot.spec-type";
/// `sandbox` or `pod`: what the artifact holds. Written by the shim; read by `snapshot get`.
pub const KIND_ANNOTATION: &str = "io.chalk.snapshot.kind";
/// The sandbox a snapshot was taken of. Written by the shim; read by `snapshot get`.
pub const SANDBOX_ANNOTATION: &str = "io.chalk.snapshot.sandbox";
/// The containerd namespace of that sandbox. Written by the shim; read by `snapshot get`.
pub const NAMESPACE_ANNOTATION: &str = "io.chalk.snapshot.namespace";
/// The packed manifest a packed snapshot's memory took pieces from. Written by chalkctl's push
/// (registries only); read by `snapshot get` and pulls.
pub const PARENT_ANNOTATION: &str = "io.chalk.snapshot.parent";
/// How many snapshots back a packed snapshot's pieces reach (0: it sent all of them).
/// Written by chalkctl's push; read by `snapshot get`.
pub const DEPTH_ANNOTATION: &str = "io.chalk.snapshot.depth";

/// Every key above, for checks that they stay distinct and well-formed.
pub const ALL: &[&str] = &[
    LIFETIME_ANNOTATION,
    ON_TIMEOUT_ANNOTATION,
    HOOKS_ANNOTATION,
    GPU_ANNOTATION,
    PRIVATE_MOUNTS_OF,
    RESTORE_FROM,
    RESUME_FROM,
    HOLD_STOP,
    NETWORK_ANNOTATION,
    PORTS_ANNOTATION,
    NETWORK_DEFAULT_ANNOTATION,
    OWNER_SANDBOX_LABEL,
    EXPIRES_AT_LABEL,
    ADDRESS_LABEL,
    NO_NETWORK_LABEL,
    NAME_LABEL,
    FORKED_FROM,
    PARENT_SANDBOX,
    RESUMED_FROM,
    SUSPENDED_FROM,
    ENDED_BECAUSE,
    RELEASED_TO,
    STDIO_LABEL,
    WEB_OWNER_LABEL,
    LABEL_SNAPSHOT,
    LABEL_SANDBOX,
    LABEL_STATUS,
    LABEL_ERROR,
    LABEL_CREATED,
    LABEL_ID,
    LABEL_BASE,
    LABEL_OWNER,
    CHECKPOINTED_AT,
    SNAPSHOTTER_ANNOTATION,
    SPEC_TYPE_ANNOTATION,
    KIND_ANNOTATION,
    SANDBOX_ANNOTATION,
    NAMESPACE_ANNOTATION,
    PARENT_ANNOTATION,
    DEPTH_ANNOTATION,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_in_our_prefixes() {
        let mut seen = std::collections::BTreeSet::new();
        for k in ALL {
            assert!(seen.insert(k), "{k} is named twice");
            assert!(
                k.starts_with("chalk.io/") || k.starts_with("io.chalk.snapshot."),
                "{k}"
            );
            // A user label's key can never collide with one of ours.
            assert!(!k.starts_with(USER_PREFIX), "{k}");
        }
    }
}
