//! Runtime options: a TOML file in the shape of gVisor's `runsc.toml`.
//!
//! ```toml
//! binary_name = "/usr/bin/runsc"   # runsc to run (a name is looked up on PATH)
//! root = "/run/chalk"              # runsc state root; one directory per namespace below it
//! log_level = "info"               # the shim's own log level: error, warn, info, debug, trace
//! allow_annotation_hooks = false   # may pods add in-sandbox hooks (chalk.io/hooks)?
//! [runsc_config]                   # each key becomes a global runsc flag: --key=value
//! platform = "ptrace"
//! network = "none"
//! [[hooks]]                        # around checkpoint and restore (see chalk-hooks)
//! stage = "post-restore"
//! command = ["/bin/hostname", "fork"]
//! [gpu]                            # the cuda-checkpoint handoff
//! lock_timeout_secs = 10
//! [snapshot]
//! check_free_space = true          # refuse a checkpoint its filesystem has no room for
//! store = "/var/lib/chalk/snapshots" # where chalkctl's snapshots are kept, as blobs
//! lazy_restore = true              # let restores run before all memory is loaded, where runsc can
//! share_pages = true               # forks of one snapshot share its memory until they write, where runsc can
//! max_pull_bytes = 68719476736     # the most a pull may bring (declared sizes, checked first)
//! push_pieces = true               # push memory as pieces: only what the registry lacks, compressed
//! max_chain_depth = 32             # a push past this many snapshots back sends all its pieces
//! [restore_from]                   # pods annotated chalk.io/restore-from start from a snapshot
//! enabled = false
//! namespaces = ["agents"]          # the Kubernetes namespaces allowed ("*": any)
//! wait_secs = 120                  # how long a restored pod waits for the snapshot's containers
//! hosts_dir = "/etc/containerd/certs.d" # registries a `REF@sha256:…` is pulled from
//! docker_config = "/etc/chalk/registry" # its config.json: the node's registry credentials
//! pull_secs = 300                  # how long that pull may take
//! registries = ["reg.example/snaps/{namespace}"] # where a namespace's pods may pull from
//! suspend_to = "reg.example/sandboxes" # agent-sandbox: a pod resumes only from SUSPEND_TO/NS/POD
//! pull_memory_bytes = 536870912    # the memory of a pod's pull (its cgroup, chalk-pulls)
//! [[restore_from.shared]]          # golden snapshots an administrator shares
//! digests = ["sha256:…"]
//! prefixes = ["reg.example/golden"]
//! namespaces = ["*"]
//! [encryption]                     # see chalk_runtime::trust
//! identities = "/etc/chalk/snapshot.key" # age identities that open encrypted snapshots (0600)
//! [network]                        # CNI networks sandboxes ask for (chalk.io/network)
//! conf_dir = "/etc/cni/net.d"      # configuration lists, found by network name
//! bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"] # the plugins
//! default_subnet = "10.77.0.0/16"  # the `chalk` network's, when it is written on first use
//! [trust]                          # which keys must have signed a snapshot before it is pulled
//! default = "allow"
//! [[trust.rules]]
//! scope = "registry.example:5000/agents"
//! keys = ["/etc/chalk/trust/agents.pub"]
//! ```
//!
//! Unknown keys and bad values are errors that name them: a typo must not silently fall back
//! to a default that widens what a sandbox can do.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Where the shim looks when containerd passes no options.
pub const DEFAULT_PATH: &str = "/etc/containerd/chalk.toml";
/// Overrides [`DEFAULT_PATH`]; it reaches the shim through containerd's environment.
pub const PATH_ENV: &str = "CHALK_SHIM_CONFIG";

const DEFAULT_BINARY: &str = "runsc";
const DEFAULT_ROOT: &str = "/run/chalk";

/// runsc flags the shim sets itself: a user value would break state tracking or error capture.
const RESERVED_FLAGS: &[(&str, &str)] = &[
    ("root", "use the top-level `root` option"),
    (
        "log",
        "the shim passes its own log file to capture runsc's errors",
    ),
    ("log-format", "the shim reads runsc's log as json"),
    (
        "log-fd",
        "the shim passes its own log file to capture runsc's errors",
    ),
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeOptions {
    #[serde(default = "default_binary")]
    pub binary_name: String,
    #[serde(default = "default_root")]
    pub root: PathBuf,
    #[serde(default)]
    pub log_level: Option<String>,
    #[serde(default)]
    pub runsc_config: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub hooks: Vec<chalk_hooks::HookSpec>,
    #[serde(default)]
    pub allow_annotation_hooks: bool,
    #[serde(default)]
    pub gpu: chalk_hooks::GpuOptions,
    #[serde(default)]
    pub snapshot: SnapshotOptions,
    /// Pods that start from a snapshot (`chalk.io/restore-from`): off unless enabled.
    #[serde(default)]
    pub restore_from: crate::pod_restore::RestoreFromOptions,
    /// The keys encrypted snapshots are opened with: none, and they are refused.
    #[serde(default)]
    pub encryption: crate::trust::EncryptionOptions,
    /// Which signatures a snapshot needs before it is pulled: none by default.
    #[serde(default)]
    pub trust: crate::trust::TrustOptions,
    /// Where the CNI networks that sandboxes ask for (`chalk.io/network`) are configured.
    #[serde(default)]
    pub network: crate::network::NetworkOptions,
}

/// `[snapshot]`: how checkpoints are taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotOptions {
    /// Refuse a checkpoint, before the sandbox is touched, when its directory's filesystem
    /// has less room than the sandbox's memory and a margin (off only where a filesystem
    /// misreports its free space).
    #[serde(default = "yes")]
    pub check_free_space: bool,
    /// The snapshot store (see `chalk_runtime::snapshot::store`): chalkctl's snapshots, one
    /// blob per file. Its filesystem must hold the checkpoints.
    #[serde(default = "default_store")]
    pub store: PathBuf,
    /// Restore with runsc's `--background` where it has it: the sandbox runs once its kernel
    /// state is loaded, its memory loading behind it (off: every restore loads all first).
    #[serde(default = "yes")]
    pub lazy_restore: bool,
    /// Restore with runsc's `--share-pages` where it has it (a runsc built with the patch in
    /// packaging/gvisor): a lazy restore from the store maps the snapshot's memory
    /// copy-on-write, so its forks share it until they write (off: each has its own copy).
    #[serde(default = "yes")]
    pub share_pages: bool,
    /// The most a pull may bring to this host (a snapshot's blobs and its base image's, as
    /// the registry declares them), checked before anything is fetched.
    #[serde(default = "default_max_pull_bytes")]
    pub max_pull_bytes: u64,
    /// Push a snapshot's memory as pieces (`snapshot::packed`): zero pages dropped, pieces
    /// zstd-compressed, and only the pieces the repository lacks sent (off: the memory file
    /// is pushed whole, as before; pulls read both forms either way).
    #[serde(default = "yes")]
    pub push_pieces: bool,
    /// How many snapshots back a pushed snapshot's pieces may reach: a push past it sends
    /// all of its pieces again, so a restore never gathers them from more packs than this.
    #[serde(default = "default_max_chain_depth")]
    pub max_chain_depth: u32,
}

/// Measured (`scripts/bench --cycles`): resumes from a chain 16 deep took no longer than from
/// a full push, and every cut re-sends the whole memory; E2B's median chain is 5 deep.
fn default_max_chain_depth() -> u32 {
    32
}

fn default_max_pull_bytes() -> u64 {
    64 << 30
}

fn default_store() -> PathBuf {
    PathBuf::from(crate::snapshot::store::DEFAULT_ROOT)
}

fn yes() -> bool {
    true
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            check_free_space: true,
            store: default_store(),
            lazy_restore: true,
            share_pages: true,
            max_pull_bytes: default_max_pull_bytes(),
            push_pieces: true,
            max_chain_depth: default_max_chain_depth(),
        }
    }
}

fn default_binary() -> String {
    DEFAULT_BINARY.to_string()
}

fn default_root() -> PathBuf {
    PathBuf::from(DEFAULT_ROOT)
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            binary_name: default_binary(),
            root: default_root(),
            log_level: None,
            runsc_config: BTreeMap::new(),
            hooks: Vec::new(),
            allow_annotation_hooks: false,
            gpu: chalk_hooks::GpuOptions::default(),
            snapshot: SnapshotOptions::default(),
            restore_from: Default::default(),
            encryption: Default::default(),
            trust: Default::default(),
            network: Default::default(),
        }
    }
}

impl RuntimeOptions {
    /// Parses and validates options text; `source_name` (a path, usually) goes into errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self> {
        let err = |message: String| Error::Options {
            source_name: source_name.to_string(),
            message,
        };
        let opts: RuntimeOptions = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        opts.validate().map_err(err)?;
        Ok(opts)
    }

    /// Reads the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Options {
            source_name: path.display().to_string(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The options the shim uses when containerd passes none: the file named by
    /// `CHALK_SHIM_CONFIG`, else `/etc/containerd/chalk.toml` if it exists, else built-in defaults.
    pub fn load_default() -> Result<Self> {
        if let Some(path) = std::env::var_os(PATH_ENV).filter(|p| !p.is_empty()) {
            return Self::load(std::path::Path::new(&path));
        }
        let path = std::path::Path::new(DEFAULT_PATH);
        if path.exists() {
            return Self::load(path);
        }
        Ok(Self::default())
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.binary_name.trim().is_empty() {
            return Err("binary_name must not be empty".into());
        }
        if !self.root.is_absolute() {
            return Err(format!(
                "root must be an absolute path, got {:?}",
                self.root
            ));
        }
        if !self.snapshot.store.is_absolute() {
            return Err(format!(
                "[snapshot] store must be an absolute path, got {:?}",
                self.snapshot.store
            ));
        }
        if let Some(level) = &self.log_level {
            if level.parse::<log::LevelFilter>().is_err() {
                return Err(format!(
                    "log_level {level:?} is not one of off, error, warn, info, debug, trace"
                ));
            }
        }
        for hook in &self.hooks {
            hook.validate().map_err(|e| e.to_string())?;
        }
        self.encryption.validate()?;
        self.trust.validate()?;
        crate::pod_restore::policy::validate(&self.restore_from)?;
        self.runsc_flags().map(|_| ())
    }

    /// The `[trust]` policy in effect: what no rule covers is refused on a node that starts
    /// pods from snapshots, unless `[trust] default` says otherwise.
    pub fn trust_policy(&self) -> crate::trust::TrustOptions {
        self.trust.with_default(self.restore_from.enabled)
    }

    /// The `[runsc_config]` table as global runsc flags, in a stable (sorted) order.
    pub fn runsc_flags(&self) -> std::result::Result<Vec<String>, String> {
        let mut flags = Vec::with_capacity(self.runsc_config.len());
        for (key, value) in &self.runsc_config {
            if !valid_flag_name(key) {
                return Err(format!(
                    "runsc_config key {key:?} is not a runsc flag name (lowercase letters, digits, '-', '_', '.')"
                ));
            }
            if let Some((_, why)) = RESERVED_FLAGS.iter().find(|(name, _)| name == key) {
                return Err(format!(
                    "runsc_config key {key:?} is set by the shim: {why}"
                ));
            }
            let value = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    return Err(format!(
                        "runsc_config key {key:?} has a {} value; use a string, boolean or number",
                        other.type_str()
                    ))
                }
            };
            flags.push(format!("--{key}={value}"));
        }
        Ok(flags)
    }

    /// The overlay flag the shim adds to runsc's: its memory overlay (root filesystem writes
    /// stay in sandbox memory, where a checkpoint captures them), unless these options choose
    /// an overlay themselves.
    pub fn added_overlay_flag(
        &self,
        features: &crate::runsc::features::Features,
    ) -> Option<&'static str> {
        let chosen = ["overlay", "overlay2"]
            .iter()
            .any(|k| self.runsc_config.contains_key(*k));
        features.memory_overlay_flag().filter(|_| !chosen)
    }

    /// The runsc `--root` for one containerd namespace, so namespaces never see each other's ids.
    pub fn runsc_root(&self, namespace: &str) -> Result<PathBuf> {
        crate::ids::validate("namespace", namespace)?;
        Ok(self.root.join(namespace))
    }
}

fn valid_flag_name(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim hands its options to chalkctl as a file (a pod's snapshot pulled at Create).
    #[test]
    fn options_written_out_read_back_the_same() {
        let o = RuntimeOptions::parse(
            "binary_name = \"/opt/runsc\"\n[runsc_config]\nplatform = \"ptrace\"\n\
             [snapshot]\nstore = \"/s\"\n[restore_from]\nenabled = true\n\
             namespaces = [\"a\"]\ndocker_config = \"/etc/chalk/registry\"\n",
            "t",
        )
        .unwrap();
        let text = toml::to_string(&o).unwrap();
        assert_eq!(RuntimeOptions::parse(&text, "written").unwrap(), o);
    }

    #[test]
    fn empty_file_gives_defaults() {
        let o = RuntimeOptions::parse("", "t").unwrap();
        assert_eq!(o, RuntimeOptions::default());
        assert_eq!(o.binary_name, "runsc");
        assert_eq!(
            o.runsc_root("k8s.io").unwrap(),
            PathBuf::from("/run/chalk/k8s.io")
        );
    }

    #[test]
    fn restoring_pods_from_snapshots_is_off_until_enabled_and_typos_are_named() {
        assert!(!RuntimeOptions::default().restore_from.enabled);
        let o = RuntimeOptions::parse(
            "[restore_from]\nenabled = true\nnamespaces = [\"agents\"]\n",
            "t",
        )
        .unwrap();
        assert!(o.restore_from.enabled);
        assert_eq!(o.restore_from.namespaces, ["agents"]);
        let err = RuntimeOptions::parse("[restore_from]\nenable = true\n", "t").unwrap_err();
        assert!(err.to_string().contains("enable"), "{err}");
    }

    #[test]
    fn snapshot_options_default_to_checking_free_space() {
        assert!(RuntimeOptions::default().snapshot.check_free_space);
        let o = RuntimeOptions::parse("[snapshot]\ncheck_free_space = false\n", "t").unwrap();
        assert!(!o.snapshot.check_free_space);
        let err = RuntimeOptions::parse("[snapshot]\ncheck_space = false\n", "t").unwrap_err();
        assert!(err.to_string().contains("check_space"), "{err}");
    }

    #[test]
    fn runsc_config_becomes_sorted_flags() {
        let o = RuntimeOptions::parse(
            r#"
binary_name = "/usr/bin/runsc"
root = "/run/x"
log_level = "debug"
[runsc_config]
platform = "ptrace"
network = "none"
debug = true
num-network-channels = 2
"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            o.runsc_flags().unwrap(),
            vec![
                "--debug=true",
                "--network=none",
                "--num-network-channels=2",
                "--platform=ptrace"
            ]
        );
    }

    #[test]
    fn hooks_and_gpu_options_are_read_and_checked() {
        let text = r#"
allow_annotation_hooks = true
[[hooks]]
stage = "pre-checkpoint"
place = "host"
command = ["/usr/bin/sync"]
timeout_secs = 5
[gpu]
lock_timeout_secs = 3
parallel = true
"#;
        let o = RuntimeOptions::parse(text, "t").unwrap();
        assert_eq!(o.hooks.len(), 1);
        assert_eq!(o.hooks[0].place, chalk_hooks::Place::Host);
        assert!(o.allow_annotation_hooks && o.gpu.parallel);
        assert_eq!(o.gpu.lock_timeout_secs, 3);
        let relative = "[[hooks]]\nstage = \"post-restore\"\ncommand = [\"sync\"]\n";
        let err = RuntimeOptions::parse(relative, "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("absolute path"), "{err}");
        let stage = "[[hooks]]\nstage = \"later\"\ncommand = [\"/x\"]\n";
        assert!(RuntimeOptions::parse(stage, "t").is_err());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = RuntimeOptions::parse("binary = \"runsc\"", "/etc/x.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/etc/x.toml") && err.contains("binary"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (text, needle) in [
            ("root = \"relative\"", "root"),
            ("log_level = \"loud\"", "loud"),
            ("binary_name = \"\"", "binary_name"),
            ("[runsc_config]\nplatform = [\"a\"]", "platform"),
            ("[runsc_config]\n\"Bad Key\" = \"x\"", "Bad Key"),
            ("[runsc_config]\nroot = \"/tmp\"", "root"),
            ("[runsc_config]\nlog-format = \"text\"", "log-format"),
            ("root = 3", "root"),
        ] {
            let err = RuntimeOptions::parse(text, "t").unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn namespace_cannot_escape_root() {
        let o = RuntimeOptions::default();
        assert!(o.runsc_root("../etc").is_err());
        assert!(o.runsc_root("").is_err());
    }

    #[test]
    fn load_reports_missing_file() {
        let err = RuntimeOptions::load(std::path::Path::new("/nonexistent/chalk.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/chalk.toml") && err.contains("cannot read"),
            "{err}"
        );
    }
}
