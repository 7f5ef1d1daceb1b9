//! The command line's definition: every command, flag and value parser (clap). Shell
//! completions and the man page are generated from it.

use std::{path::PathBuf, time::Duration};

use chalk_client::{ops::run, stdio::state};
use chalk_client::{
    records::registry::{self, Status},
    remote::{self, hosts},
};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "chalkctl",
    version,
    about = "chalk-shim sandboxes on containerd: run, exec, attach, logs, snapshot, fork, suspend, resume, rm"
)]
pub struct Cli {
    /// containerd's socket.
    #[arg(
        long,
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub address: String,
    /// containerd namespace.
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "CONTAINERD_NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// The shim's runtime options, for the snapshot store they name ([snapshot] store).
    #[arg(long, global = true, env = "CHALK_SHIM_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Where chalkctl keeps the stdio of the sandboxes it starts (fifos, logs, attach
    /// sockets; root only). One per containerd.
    #[arg(long, global = true, env = "CHALKCTL_STATE_DIR", default_value = state::DEFAULT_ROOT)]
    pub state_dir: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Start a sandbox of this runtime; its output is kept (`logs`), and with --tty its
    /// terminal can be attached to (`attach`).
    Run {
        image: String,
        id: String,
        /// The snapshotter the image is unpacked for.
        #[arg(long, default_value = "overlayfs")]
        snapshotter: String,
        /// Give the init a terminal (attach to it with `chalkctl attach`).
        #[arg(long, short = 't')]
        tty: bool,
        /// KEY=VALUE added to the image's environment (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// The init's working directory.
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Memory limit: bytes, or with k, m, g (512m).
        #[arg(long, value_parser = parse_memory)]
        memory: Option<u64>,
        /// CPU limit: how many CPUs' time (1.5).
        #[arg(long, value_parser = parse_cpus)]
        cpus: Option<f64>,
        #[command(flatten)]
        name: NameArg,
        #[command(flatten)]
        lifetime: LifetimeArgs,
        /// The CNI network (a configuration list's name in the runtime options' conf_dir):
        /// `chalk`, a bridge with NAT written on first use, by default where this host can
        /// give it; `none` for loopback only.
        #[arg(long, value_name = "NAME")]
        net: Option<String>,
        /// Publish a port: [HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp] (repeatable).
        #[arg(long = "publish", short = 'p', value_name = "PORT")]
        publish: Vec<String>,
        /// The command, replacing the image's (after --).
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// Run a command in a running sandbox; its exit status is chalkctl's.
    Exec {
        /// The sandbox (id or name).
        #[arg(long)]
        id: String,
        /// A terminal for the command (raw mode here; the window size follows).
        #[arg(long, short = 't')]
        tty: bool,
        /// Pass this side's stdin to the command.
        #[arg(long, short = 'i')]
        interactive: bool,
        /// KEY=VALUE added to the sandbox's environment (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// The command's working directory.
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// The command (after --).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// This terminal on a sandbox's init (run with --tty): detach with Ctrl-P Ctrl-Q.
    Attach {
        #[arg(long)]
        id: String,
    },
    /// What a sandbox's init printed (kept for sandboxes chalkctl started, forked or resumed).
    Logs {
        #[arg(long)]
        id: String,
        /// Go on printing what it prints, until it exits or is suspended.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Remove sandboxes: task, container, root filesystem and chalkctl's state (never their
    /// snapshots). A running one only with --force.
    Rm {
        /// The sandboxes (repeatable; ids or names).
        #[arg(long, required = true, num_args = 1..)]
        id: Vec<String>,
        /// Stop a running sandbox first: SIGTERM, then SIGKILL after --grace.
        #[arg(long)]
        force: bool,
        /// How long a sandbox has to exit on SIGTERM (e.g. 10s).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        grace: Duration,
    },
    /// Wait until a sandbox runs, or until its init exits (prints the exit status).
    Wait {
        #[arg(long)]
        id: String,
        #[arg(long = "for", value_enum, default_value = "exited")]
        until: UntilArg,
        /// Give up after this long (e.g. 30s); no limit by default.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Serves a memory file while it arrives (what a lazy pull starts; its job on stdin).
    #[command(hide = true)]
    ServeLazy,
    /// The stdio keeper of one sandbox (what run, fork and resume start).
    #[command(hide = true)]
    Keep {
        #[arg(long)]
        id: String,
        #[arg(long)]
        terminal: bool,
    },
    /// Shell completions, to stdout (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// The man page (roff), to stdout.
    Man,
    /// The snapshot registry.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// New running sandboxes from a snapshot (--snapshot-id), or from a running sandbox
    /// (--id: snapshotted, forked, and the snapshot deleted once the forks run), each
    /// reported on its own.
    Fork {
        /// The snapshot to fork.
        #[arg(long, required_unless_present_any = ["id", "snapshot"])]
        snapshot_id: Option<String>,
        /// The running sandbox to fork (instead of --snapshot-id).
        #[arg(long)]
        id: Option<String>,
        /// A snapshot in a registry to fork (pulled first: only what this host lacks; its
        /// memory arrives while the fork runs, where this host and its runsc allow).
        #[arg(long, value_name = "REF", conflicts_with_all = ["id", "snapshot_id"])]
        snapshot: Option<String>,
        /// With --snapshot: fetch the memory whole before the fork starts.
        #[arg(long, requires = "snapshot")]
        whole: bool,
        #[command(flatten)]
        registry: RegistryArgs,
        /// The new sandbox's id (with --count N: ID-1 .. ID-N); `<source>-fork-<time>` by
        /// default.
        #[arg(long)]
        fork_id: Option<String>,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[command(flatten)]
        name: NameArg,
        /// With --id: keep the snapshot taken for the fork.
        #[arg(long)]
        keep_snapshot: bool,
        /// Fork even when the host's available memory looks too small for every copy.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        lifetime: LifetimeArgs,
        /// Publish a port from the fork (its source's are not inherited):
        /// [HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp] (repeatable; one fork only).
        #[arg(long = "publish", short = 'p', value_name = "PORT")]
        publish: Vec<String>,
    },
    /// The fork tree: every sandbox under the one it was forked from, with its status (the
    /// tree below --id only, when given).
    Tree {
        #[arg(long)]
        id: Option<String>,
    },
    /// What the shim runs when a sandbox's lifetime ends: destroy or suspend it.
    #[command(hide = true)]
    Expire {
        #[arg(long)]
        id: String,
        #[arg(long, value_parser = ["destroy", "suspend"])]
        action: String,
    },
    /// Sandboxes of this runtime with their status and snapshots (stopped ones with --all).
    List {
        #[arg(long)]
        all: bool,
    },
    /// One sandbox: status, image, and its snapshots.
    Get {
        #[arg(long)]
        id: String,
    },
    /// Checkpoint a sandbox, then release its compute; it reads `suspended`.
    Suspend {
        #[arg(long)]
        id: String,
        /// Also push the snapshot to this registry reference (repo:tag).
        #[arg(long, value_name = "REF")]
        to: Option<String>,
        /// With --to: delete the local copy once the registry has it (the node keeps only
        /// the sandbox's record).
        #[arg(long, requires = "to")]
        release: bool,
        #[command(flatten)]
        registry: RegistryArgs,
        #[command(flatten)]
        seal: SealArgs,
    },
    /// The same sandbox id running again from where it was suspended (on another host: give
    /// --from, the reference it was suspended to).
    Resume {
        #[arg(long)]
        id: String,
        /// Pull the snapshot from this registry reference when this host lacks it (its
        /// memory arrives while the sandbox runs, where this host and its runsc allow).
        #[arg(long, value_name = "REF")]
        from: Option<String>,
        /// Fetch the memory whole before the sandbox starts.
        #[arg(long)]
        whole: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

/// How to reach a registry (as ctr and containerd do).
#[derive(clap::Args, Clone)]
pub struct RegistryArgs {
    /// containerd's registry hosts directory: <host[:port]>/hosts.toml for mirrors, CA files
    /// and skip_verify.
    #[arg(long, env = "CHALK_HOSTS_DIR", default_value = hosts::DEFAULT_DIR)]
    pub hosts_dir: std::path::PathBuf,
    /// Plain HTTP to a registry that hosts.toml does not describe (HTTPS otherwise).
    #[arg(long)]
    pub plain_http: bool,
    /// Registry credentials, user[:password] (the password is read from stdin when left
    /// out); the docker config.json's otherwise.
    #[arg(long, short = 'u', value_name = "USER[:PASSWORD]")]
    pub user: Option<String>,
}

impl RegistryArgs {
    pub fn access(&self) -> remote::Access {
        remote::Access {
            plain_http: self.plain_http,
            user: self.user.clone(),
            ..remote::Access::new(self.hosts_dir.clone())
        }
    }

    /// For a pull a restore follows: unless `whole`, its memory file may arrive while the
    /// sandbox runs, served by this program (`chalkctl serve-lazy`).
    pub fn access_lazy(&self, whole: bool) -> remote::Access {
        remote::Access {
            lazy_server: std::env::current_exe().ok().filter(|_| !whole),
            ..self.access()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UntilArg {
    Running,
    Exited,
}

/// A name for what is made, accepted wherever its id is.
#[derive(clap::Args, Clone)]
pub struct NameArg {
    /// A name, accepted wherever the id is (several at once: NAME-1 .. NAME-N).
    #[arg(long)]
    pub name: Option<String>,
}

pub fn parse_memory(s: &str) -> Result<u64, String> {
    run::parse_memory(s).map_err(|e| e.to_string())
}

pub fn parse_cpus(s: &str) -> Result<f64, String> {
    run::parse_cpus(s).map_err(|e| e.to_string())
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    chalk_runtime::lifetime::parse_duration(s).map_err(|e| e.to_string())
}

/// A sandbox's lifetime (`run`; `fork` overrides the one its forks inherit).
#[derive(clap::Args, Clone)]
pub struct LifetimeArgs {
    /// How long the sandbox may run, from each start or resume (e.g. 600s, 10m, 1h30m);
    /// the `chalk.io/lifetime` annotation.
    #[arg(long, value_parser = parse_lifetime)]
    pub lifetime: Option<String>,
    /// What happens when the lifetime ends: destroy (the default) or suspend; the
    /// `chalk.io/on-timeout` annotation.
    #[arg(long, value_parser = ["destroy", "suspend"])]
    pub on_timeout: Option<String>,
}

pub fn parse_lifetime(s: &str) -> Result<String, String> {
    chalk_runtime::lifetime::parse_duration(s).map(|_| s.to_string())
}

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a running sandbox; it keeps running. Prints the snapshot id.
    Create {
        #[arg(long)]
        id: String,
        /// A label to attach, key=value (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Return at once with the pending snapshot's name; a background chalkctl takes the
        /// checkpoint (`snapshot wait` waits for it).
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        name: NameArg,
    },
    /// Wait until a snapshot is completed (prints its id) or failed (its error).
    Wait {
        #[arg(long)]
        snapshot_id: String,
        /// Give up after this long (e.g. 60s); no limit by default.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Takes the checkpoint of a pending snapshot (what --no-wait starts in the background).
    #[command(hide = true)]
    Finish {
        #[arg(long)]
        name: String,
    },
    /// Status, source, creation time, labels and the manifest's main fields.
    Get {
        #[arg(long)]
        snapshot_id: String,
    },
    /// One page of snapshots, newest first.
    List {
        #[arg(long)]
        sandbox_id: Option<String>,
        #[arg(long, value_parser = parse_status)]
        status: Option<Status>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Remove what no snapshot needs from the snapshot store: blobs of deleted snapshots,
    /// what a crashed checkpoint or restore left (run by `delete` too).
    Gc,
    /// Remove a snapshot (never its source or its forks).
    Delete {
        #[arg(long)]
        snapshot_id: String,
    },
    /// Push a snapshot to an OCI registry (with its base image when the repository lacks
    /// it); blobs the registry has are not sent again. Prints REF@digest.
    Push {
        #[arg(long)]
        snapshot_id: String,
        /// Where: host[:port]/repository[:tag].
        reference: String,
        #[command(flatten)]
        registry: RegistryArgs,
        #[command(flatten)]
        seal: SealArgs,
    },
    /// Pull a snapshot from an OCI registry into this host (only the blobs it lacks, each
    /// checked by digest), after checking this host can restore it. Prints its id.
    Pull {
        reference: String,
        /// Leave pages.img to arrive while a restore already reads it (what a pod's
        /// chalk.io/restore-from asks for), where this host, its runsc and the registry allow.
        #[arg(long)]
        lazy: bool,
        /// The Kubernetes namespace the copy is pulled for (the shim, for a pod): its owner
        /// on this host.
        #[arg(long, value_name = "NAMESPACE")]
        pulled_for: Option<String>,
        /// Give up (cleanly) if the pull has not ended within this many seconds.
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<u64>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Make a key: an age identity that opens encrypted snapshots (prints its recipient, for
    /// --encrypt-to), or with --signing a P-256 signing key and its public key (FILE.pub).
    /// The key file is owner-only and never overwritten.
    Keygen {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        #[arg(long)]
        signing: bool,
    },
    /// Sign a snapshot in a registry (as cosign signs: cosign verify --key accepts it).
    Sign {
        reference: String,
        /// A PEM P-256 private key (owner-only).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Check a snapshot's signatures in a registry: against --key (PEM public keys, as
    /// cosign's), or else as the runtime options' [trust] policy decides a pull. Fails unless
    /// they let it in.
    Verify {
        reference: String,
        #[arg(long, value_name = "FILE")]
        key: Vec<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

/// How a push protects the snapshot.
#[derive(clap::Args, Clone)]
pub struct SealArgs {
    /// Encrypt every blob for this recipient first (an age1… key, or a file of them; give
    /// it again for more): a host opens it with a key in [encryption] identities.
    #[arg(long, value_name = "RECIPIENT")]
    pub encrypt_to: Vec<String>,
    /// Sign the pushed manifest with this PEM P-256 private key, as cosign signs.
    #[arg(long, value_name = "KEY")]
    pub sign: Option<PathBuf>,
}

impl SealArgs {
    pub fn apply(&self, access: remote::Access) -> remote::Access {
        remote::Access {
            encrypt_to: self.encrypt_to.clone(),
            sign_with: self.sign.clone(),
            ..access
        }
    }
}

pub fn parse_label(s: &str) -> Result<(String, String), String> {
    registry::parse_label(s).map_err(|e| e.to_string())
}

pub fn parse_status(s: &str) -> Result<Status, String> {
    Status::parse(s).map_err(|e| e.to_string())
}
