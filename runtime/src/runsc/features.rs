//! What the installed runsc can do, read from the binary itself (its `flags` listing, its
//! subcommands and its version), never from a table of release dates. Parsers are pure.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// `runsc --version`'s first line, e.g. `runsc version 0.0~20221219.0`.
    pub version: String,
    /// Global flag names without the dash.
    pub global_flags: BTreeSet<String>,
    /// Subcommands, from `runsc help` (the 2022 build has no `update`).
    #[serde(default)]
    pub commands: BTreeSet<String>,
    /// Flags of `runsc checkpoint`, from `runsc help checkpoint`.
    #[serde(default)]
    pub checkpoint_flags: BTreeSet<String>,
    /// Flags of `runsc kill`, from `runsc help kill`.
    #[serde(default)]
    pub kill_flags: BTreeSet<String>,
    /// Flags of `runsc restore`, from `runsc help restore`.
    #[serde(default)]
    pub restore_flags: BTreeSet<String>,
    /// Flags of `runsc wait`, from `runsc help wait`.
    #[serde(default)]
    pub wait_flags: BTreeSet<String>,
    /// Which network runsc's defaults can have on this host, once probed (see [`super::probe`]).
    #[serde(default)]
    pub network_probe: Option<super::probe::NetworkProbe>,
}

/// How a checkpoint leaves the source running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveRunning {
    /// `--leave-running` resumes the same sandbox (gVisor since 2024).
    InPlace,
    /// `--leave-running` would restore a new sandbox as the checkpoint's child (and panics on
    /// a paused one, as in the 2022 build): the shim checkpoints, then restores the sandbox
    /// under the same id itself.
    RestoreAfter,
}

impl Features {
    pub fn from_outputs(version_output: &str, flags_output: &str) -> Self {
        Features {
            version: parse_version(version_output),
            global_flags: parse_flag_names(flags_output),
            commands: BTreeSet::new(),
            checkpoint_flags: BTreeSet::new(),
            kill_flags: BTreeSet::new(),
            restore_flags: BTreeSet::new(),
            wait_flags: BTreeSet::new(),
            network_probe: None,
        }
    }

    /// Adds the subcommands listed by `runsc help`.
    pub fn with_help(mut self, help_output: &str) -> Self {
        self.commands = parse_commands(help_output);
        self
    }

    pub fn has_command(&self, name: &str) -> bool {
        self.commands.contains(name)
    }

    /// Adds the flags listed by `runsc help checkpoint`.
    pub fn with_checkpoint_help(mut self, output: &str) -> Self {
        self.checkpoint_flags = parse_flag_names(output);
        self
    }

    /// Adds the flags listed by `runsc help kill`.
    pub fn with_kill_help(mut self, output: &str) -> Self {
        self.kill_flags = parse_flag_names(output);
        self
    }

    /// Adds the flags listed by `runsc help restore` and `runsc help wait`.
    pub fn with_restore_help(mut self, restore: &str, wait: &str) -> Self {
        self.restore_flags = parse_flag_names(restore);
        self.wait_flags = parse_flag_names(wait);
        self
    }

    /// Whether a restore can let the sandbox run while its memory still loads
    /// (`restore --background`, 2024-09 on) and tell when loading ends (`wait --restore`).
    pub fn lazy_restore(&self) -> bool {
        self.restore_flags.contains("background") && self.wait_flags.contains("restore")
    }

    /// Whether a restore can map the checkpoint's pages file copy-on-write as the sandbox's
    /// private memory, shared with the other restores of that image until written
    /// (`restore --share-pages`: the gVisor patch in packaging/gvisor).
    pub fn share_pages(&self) -> bool {
        self.restore_flags.contains("share-pages")
    }

    /// Whether a checkpoint of a sandbox restored with `--share-pages` can write only the
    /// memory that is not its base's (`checkpoint --base-pages`: packaging/gvisor's patch
    /// 0003; see [`super::delta`]).
    pub fn checkpoint_base_pages(&self) -> bool {
        self.checkpoint_flags.contains("base-pages")
    }

    /// The checkpoint flags that give the three-file, uncompressed image a lazy restore and
    /// the store need, where this runsc has the choice (`--compression`; none is the default
    /// of later builds, said anyway).
    pub fn uncompressed_checkpoint_flags(&self) -> Vec<String> {
        if self.checkpoint_flags.contains("compression") {
            vec!["--compression=none".to_string()]
        } else {
            Vec::new()
        }
    }

    /// Whether `runsc kill --all` misses the init of a restored sandbox (the builds that
    /// cannot checkpoint in place: their restore keeps the container's processes apart from
    /// its init), so the init is signalled on its own as well.
    pub fn kill_all_misses_restored_init(&self) -> bool {
        self.leave_running() == LeaveRunning::RestoreAfter
    }

    /// Whether `runsc kill` can signal a process group (`--pgid`, 2023 on).
    pub fn kill_has_pgid(&self) -> bool {
        self.kill_flags.contains("pgid")
    }

    /// Which leave-running path this runsc needs. Both generations describe `--leave-running`
    /// alike, so the answer comes from a checkpoint flag that only builds made after the
    /// in-place resume have (`--save-restore-exec-argv`). A build between the two reads as
    /// [`LeaveRunning::RestoreAfter`], which is slower but correct on every build.
    pub fn leave_running(&self) -> LeaveRunning {
        if self.checkpoint_flags.contains("save-restore-exec-argv") {
            LeaveRunning::InPlace
        } else {
            LeaveRunning::RestoreAfter
        }
    }

    /// The global flag that keeps root filesystem writes in sandbox memory, where a
    /// checkpoint captures them: `--overlay2=root:memory` on current builds, `--overlay` on
    /// the 2022 one. None when this runsc has neither.
    pub fn memory_overlay_flag(&self) -> Option<&'static str> {
        if self.global_flags.contains("overlay2") {
            Some("--overlay2=root:memory")
        } else if self.global_flags.contains("overlay") {
            Some("--overlay")
        } else {
            None
        }
    }

    /// Checks `--key=value` flags from the runtime options against what this runsc accepts.
    pub fn check_flags(&self, flags: &[String]) -> Result<(), String> {
        if self.global_flags.is_empty() {
            return Ok(()); // nothing could be read: let runsc itself judge
        }
        for flag in flags {
            let name = flag.trim_start_matches('-');
            let name = name.split_once('=').map_or(name, |(n, _)| n);
            if !self.global_flags.contains(name) {
                return Err(format!(
                    "runsc_config key {name:?} is not a flag of this runsc ({}); see `runsc flags`",
                    self.version
                ));
            }
        }
        Ok(())
    }
}

/// Finds `binary` the way `Command` will: a path as is, a bare name on PATH.
pub fn resolve_binary(binary: &Path) -> Option<PathBuf> {
    if binary.components().count() > 1 {
        return Some(binary.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(binary))
            .find(|candidate| candidate.is_file())
    })
}

/// A cache of probed [`Features`], one small JSON file per runsc binary, valid while the
/// binary's inode, size and mtime are unchanged. Probing costs two runsc runs (about 50 ms);
/// every container's create would pay it, since each shim is a new process.
pub struct FeatureCache {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct CacheEntry {
    fingerprint: String,
    features: Features,
}

impl FeatureCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FeatureCache { dir: dir.into() }
    }

    fn fingerprint(binary: &Path) -> Option<(PathBuf, String)> {
        let path = resolve_binary(binary)?.canonicalize().ok()?;
        let m = std::fs::metadata(&path).ok()?;
        // The leading number is the cache format: bump it when Features gains a field.
        let print = format!(
            "6:{}:{}:{}:{}:{}.{}",
            path.display(),
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        );
        let name = format!(
            "{:x}.json",
            Sha256::digest(path.as_os_str().as_encoded_bytes())
        );
        Some((PathBuf::from(name), print))
    }

    pub fn get(&self, binary: &Path) -> Option<Features> {
        let (name, print) = Self::fingerprint(binary)?;
        let bytes = std::fs::read(self.dir.join(name)).ok()?;
        let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
        (entry.fingerprint == print).then_some(entry.features)
    }

    /// Best effort: a cache that cannot be written only costs the next probe.
    pub fn put(&self, binary: &Path, features: &Features) {
        use std::os::unix::fs::DirBuilderExt;
        let Some((name, print)) = Self::fingerprint(binary) else {
            return;
        };
        let entry = CacheEntry {
            fingerprint: print,
            features: features.clone(),
        };
        let Ok(bytes) = serde_json::to_vec(&entry) else {
            return;
        };
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .is_err()
        {
            return;
        }
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = self
            .dir
            .join(format!(".{}.{}", name.display(), std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() {
            let _ = std::fs::rename(&tmp, self.dir.join(name));
        }
    }
}

/// Flag names from `runsc flags`, whose lines look like `  -platform string` or `  -debug`.
pub fn parse_flag_names(output: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('-')?;
            if !line.starts_with(' ') {
                return None;
            }
            let name = rest.split_whitespace().next()?;
            Some(name.to_string())
        })
        .collect()
}

/// Subcommand names from `runsc help`: lines of a tab, a name, spaces and a description.
pub fn parse_commands(output: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter(|l| l.starts_with('\t'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .map(String::from)
        .collect()
}

pub fn parse_version(output: &str) -> String {
    output.lines().next().unwrap_or("").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &str = "  -debug\n    \tenable debug logging.\n  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default \"ptrace\")\n  -overlay2 value\n    \tspecifies how to overlay\n  -net-raw runsc exec\n    \tenable raw sockets.\n";

    #[test]
    fn parses_flag_names() {
        let names = parse_flag_names(FLAGS);
        let expected: BTreeSet<String> = ["debug", "platform", "overlay2", "net-raw"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(names, expected);
    }

    #[test]
    fn parses_subcommands() {
        let help = "Subcommands:\n\tcheckpoint       checkpoint current state\n\tupdate           update container resource constraints\n\nSubcommands for debug:\n\tdebug            shows a variety\n";
        let f = Features::default().with_help(help);
        assert!(f.has_command("update") && f.has_command("checkpoint"));
        assert!(!Features::default()
            .with_help("\tcheckpoint  x\n")
            .has_command("update"));
    }

    #[test]
    fn checks_flags_against_binary() {
        let f = Features::from_outputs("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n", FLAGS);
        assert_eq!(f.version, "runsc version 0.0~20221219.0");
        assert!(f
            .check_flags(&["--platform=ptrace".into(), "--debug=true".into()])
            .is_ok());
        let err = f.check_flags(&["--plattform=ptrace".into()]).unwrap_err();
        assert!(
            err.contains("plattform") && err.contains("20221219"),
            "{err}"
        );
    }

    #[test]
    fn cache_is_keyed_by_the_binary_and_invalidated_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("runsc");
        std::fs::write(&bin, "v1").unwrap();
        let cache = FeatureCache::new(dir.path().join("cache"));
        assert_eq!(cache.get(&bin), None);
        let f = Features::from_outputs("runsc version 1", FLAGS);
        cache.put(&bin, &f);
        assert_eq!(cache.get(&bin), Some(f));
        std::fs::write(&bin, "version two").unwrap();
        assert_eq!(cache.get(&bin), None, "a replaced binary is probed again");
    }

    #[test]
    fn bare_names_resolve_on_path() {
        assert!(resolve_binary(Path::new("sh")).is_some());
        assert_eq!(
            resolve_binary(Path::new("/x/runsc")),
            Some(PathBuf::from("/x/runsc"))
        );
        assert!(resolve_binary(Path::new("no-such-binary-chalk")).is_none());
    }

    #[test]
    fn leave_running_path_and_overlay_come_from_the_flags() {
        let old = Features::from_outputs("runsc version 0.0~20221219.0", "  -overlay\n")
            .with_checkpoint_help(
                "checkpoint [flags] <container id>\n  -image-path string\n  -leave-running\n",
            );
        assert_eq!(old.leave_running(), LeaveRunning::RestoreAfter);
        assert_eq!(old.memory_overlay_flag(), Some("--overlay"));
        let new = Features::from_outputs("runsc version x", FLAGS).with_checkpoint_help(
            "  -leave-running\n  -save-restore-exec-argv string\n  -compression value\n",
        );
        assert_eq!(new.leave_running(), LeaveRunning::InPlace);
        assert_eq!(new.memory_overlay_flag(), Some("--overlay2=root:memory"));
        assert_eq!(Features::default().memory_overlay_flag(), None);
    }

    #[test]
    fn unknown_listing_defers_to_runsc() {
        assert!(Features::default()
            .check_flags(&["--anything=1".into()])
            .is_ok());
    }

    #[test]
    fn lazy_restore_and_compression_are_read_from_the_help() {
        let old = Features::default()
            .with_checkpoint_help("  -image-path string\n  -leave-running\n")
            .with_restore_help("  -detach\n  -image-path string\n", "  -pid int\n");
        assert!(!old.lazy_restore());
        assert!(old.uncompressed_checkpoint_flags().is_empty());
        let new = Features::default()
            .with_checkpoint_help("  -compression value\n    \tcompress\n  -leave-running\n")
            .with_restore_help("  -background\n  -detach\n", "  -checkpoint\n  -restore\n");
        assert!(new.lazy_restore());
        assert_eq!(new.uncompressed_checkpoint_flags(), ["--compression=none"]);
        assert!(!new.share_pages());
        let patched = Features::default().with_restore_help(
            "  -background\n  -share-pages\n    \tmap the pages file\n",
            "  -restore\n",
        );
        assert!(patched.share_pages());
        assert!(!new.checkpoint_base_pages() && !patched.checkpoint_base_pages());
        let delta = Features::default().with_checkpoint_help(
            "  -base-pages string
    	write only pages not backed
",
        );
        assert!(delta.checkpoint_base_pages());
    }
}
