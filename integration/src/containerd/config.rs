//! The private containerd's configuration: its config.toml (with CRI, CNI and registry
//! hosts for a node), and the chalk runtime options the installer registers, pointed at the
//! test's own runsc root, store and networks.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use super::{containerd_is_2x, PAUSE_IMAGE};

/// What the private containerd serves.
#[derive(Debug, Clone, Default)]
pub enum Setup {
    /// containerd's API only (CRI disabled): what `ctr` and chalkctl need.
    #[default]
    Plain,
    /// As `Plain`, its shim running this runsc instead of the cell's.
    Runsc(PathBuf),
    /// With the CRI plugin, the `chalk` handler registered by packaging/install.sh, the pause
    /// image as sandbox image; pods get networks from the CNI plugins in `cni_bin` when set
    /// (else only host-network pods can run).
    Cri {
        cni_bin: Option<PathBuf>,
        /// containerd's registry hosts directory (`config_path`): mirrors for image pulls, and
        /// where pods' snapshots are pulled from (`[restore_from] hosts_dir`).
        registry_hosts: Option<PathBuf>,
        /// A docker config directory with those registries' credentials
        /// (`[restore_from] docker_config`).
        registry_auth: Option<PathBuf>,
        /// Which pod network (bridge and subnet) of [`cni_conflist`]: one per node when
        /// several share this machine.
        network: u8,
        /// More runtime options for the node (`[trust]`, `[encryption]`).
        options: String,
        /// More keys of its `[restore_from]` (`registries`, `suspend_to`, ...).
        restore_from: String,
    },
}

/// Where the repository's packaging/install.sh is.
pub fn installer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/install.sh")
}

/// Registers the chalk runtime in `d/config.toml` the way a node gets it: packaging/install.sh.
pub(super) fn register_with_installer(d: &Path) -> io::Result<()> {
    let out = Command::new("bash")
        .arg(installer_script())
        .args(["--config-only", "--config"])
        .arg(d.join("config.toml"))
        .arg("--options")
        .arg(d.join("chalk.toml"))
        .arg("--state")
        .arg(d.join("installer"))
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "install.sh --config-only: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

pub(super) fn snapshot_store(d: &Path) -> PathBuf {
    d.join("snapshots")
}

pub(super) fn runtime_options(d: &Path, setup: &Setup) -> String {
    let packaged = include_str!("../../../packaging/chalk.toml");
    // The packaged file with a private runsc root, so test runs never meet.
    let mut out = String::new();
    for line in packaged.lines() {
        if line.trim_start().starts_with("root") && !line.contains('[') {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    // CHALK_RUNSC_DEBUG=<dir>: runsc's debug logs of every sandbox there (%ID% per
    // container), to read after an intermittent failure.
    if let Some(dir) = std::env::var_os("CHALK_RUNSC_DEBUG").filter(|v| !v.is_empty()) {
        out = out.replacen(
            "[runsc_config]\n",
            &format!(
                "[runsc_config]\ndebug = true\ndebug-log = \"{}/%ID%/\"\n",
                PathBuf::from(dir).display()
            ),
            1,
        );
    }
    // Pods with a CNI network get it inside the sandbox (runsc's own network stack).
    if let Setup::Cri {
        cni_bin: Some(_), ..
    } = setup
    {
        out = out.replace("network = \"none\"", "network = \"sandbox\"");
    }
    // Tests add hooks by annotation (chalk.io/hooks); nodes opt in to that themselves.
    let mut head = format!(
        "root = \"{}\"\nallow_annotation_hooks = true\n",
        d.join("runsc").display()
    );
    // CHALK_RUNSC picks another runsc (the test matrix); the packaged file names Debian's.
    let runsc = match setup {
        Setup::Runsc(p) => Some(p.clone().into_os_string()),
        _ => std::env::var_os("CHALK_RUNSC").filter(|v| !v.is_empty()),
    };
    if let Some(runsc) = runsc {
        out = out
            .lines()
            .filter(|l| !l.trim_start().starts_with("binary_name"))
            .map(|l| format!("{l}\n"))
            .collect();
        head.push_str(&format!(
            "binary_name = \"{}\"\n",
            PathBuf::from(runsc).display()
        ));
    }
    // A CRI node lets the tests' namespace start pods from snapshots (chalk.io/restore-from).
    let restore = match setup {
        Setup::Cri {
            registry_hosts,
            registry_auth,
            options,
            restore_from,
            ..
        } => {
            let namespaces = if restore_from.contains("namespaces =") {
                ""
            } else {
                "namespaces = [\"default\"]\n"
            };
            let mut r =
                format!("\n{options}\n[restore_from]\nenabled = true\n{namespaces}wait_secs = 8\n");
            if let Some(hosts) = registry_hosts {
                r.push_str(&format!("hosts_dir = \"{}\"\n", hosts.display()));
            }
            if let Some(auth) = registry_auth {
                r.push_str(&format!("docker_config = \"{}\"\n", auth.display()));
            }
            // Last: it may open tables of its own ([[restore_from.shared]]).
            r.push_str(restore_from);
            r.push('\n');
            r
        }
        _ => String::new(),
    };
    // Snapshots of this containerd in a store of its own: a store's gc answers to one
    // containerd's records.
    format!(
        "{head}{out}\n{}\n[snapshot]\nstore = \"{}\"\n{restore}",
        network_options(d),
        snapshot_store(d).display()
    )
}

/// Where a test host's sandboxes find their CNI networks: a configuration directory of its
/// own (`chalk`, the default network, is written there on first use; a test may write
/// another network there first), and the plugins scripts/peers builds (`CHALK_CNI_BIN`).
/// Without them, chalkctl's default network is not there and sandboxes get loopback only.
fn network_options(d: &Path) -> String {
    let bin = std::env::var_os("CHALK_CNI_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| d.join("cni").join("no-plugins"));
    format!(
        "[network]\nconf_dir = \"{}\"\nbin_dirs = [\"{}\"]\n",
        network_conf_dir(d).display(),
        bin.display()
    )
}

/// A test host's CNI configuration directory (see [`network_options`]).
pub fn network_conf_dir(d: &Path) -> PathBuf {
    d.join("cni").join("chalk-net.d")
}

pub(super) fn config(d: &Path, setup: &Setup) -> String {
    // A CRI node config is in the version its containerd writes (the installer follows it).
    let version = match setup {
        Setup::Cri { .. } if containerd_is_2x() => 3,
        _ => 2,
    };
    let mut text = format!(
        r#"version = {version}
root = "{root}"
state = "{state}"
{disabled}
[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  level = "debug"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
        root = d.join("root").display(),
        state = d.join("state").display(),
        sock = d.join("containerd.sock").display(),
        opt = d.join("opt").display(),
        disabled = match setup {
            Setup::Plain | Setup::Runsc(_) => {
                "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
            }
            Setup::Cri { .. } => "",
        },
    );
    if let Setup::Cri {
        cni_bin,
        registry_hosts,
        network,
        ..
    } = setup
    {
        let (images, runtime, sandbox_image) = if version == 3 {
            (
                "io.containerd.cri.v1.images",
                "io.containerd.cri.v1.runtime",
                format!("[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = \"{PAUSE_IMAGE}\"\n"),
            )
        } else {
            (
                "io.containerd.grpc.v1.cri",
                "io.containerd.grpc.v1.cri",
                format!("[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{PAUSE_IMAGE}\"\n"),
            )
        };
        let cni_conf = d.join("cni").join("conf");
        let _ = fs::create_dir_all(&cni_conf);
        let bin = cni_bin.clone().unwrap_or_else(|| d.join("cni").join("bin"));
        if cni_bin.is_some() {
            let _ = fs::write(cni_conf.join("10-chalk.conflist"), cni_conflist(*network));
        }
        // containerd 2.x reads a list of plugin directories (`bin_dir` is ignored there).
        let bin_key = if version == 3 { "bin_dirs" } else { "bin_dir" };
        let bin_value = if version == 3 {
            format!("[\"{}\"]", bin.display())
        } else {
            format!("\"{}\"", bin.display())
        };
        text.push_str(&format!(
            "\n{sandbox_image}\n[plugins.\"{runtime}\".cni]\n  {bin_key} = {bin_value}\n  conf_dir = \"{}\"\n",
            cni_conf.display()
        ));
        if let Some(hosts) = registry_hosts {
            text.push_str(&format!(
                "\n[plugins.\"{images}\".registry]\n  config_path = \"{}\"\n",
                hosts.display()
            ));
        }
    }
    text
}

/// A bridge network for pods, private to the test run.
fn cni_conflist(network: u8) -> String {
    // 10.88.78.0/24 holds the test nodes' own addresses (crate::k8s).
    let subnet = format!(
        "10.88.{}.0/24",
        if network == 0 { 77 } else { 78 + network }
    );
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "chalk-test{network}",
  "plugins": [
    {{"type": "bridge", "bridge": "chalk-cni{network}", "isGateway": true, "ipMasq": true,
     "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{subnet}"}}]],
              "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}},
    {{"type": "loopback"}}
  ]
}}
"#
    )
}
