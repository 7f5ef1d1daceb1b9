//! What the installed runsc can do, read from the binary itself (its `flags` listing, its
//! subcommands and its version), never from a table of release dates. Parsers are pure.

use std::collections::BTreeSet;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// `runsc --version`'s first line, e.g. `runsc version 0.0~20221219.0`.
    pub version: String,
    /// Global flag names without the dash.
    pub global_flags: BTreeSet<String>,
}

impl Features {
    pub fn from_outputs(version_output: &str, flags_output: &str) -> Self {
        Features {
            version: parse_version(version_output),
            global_flags: parse_flag_names(flags_output),
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
    fn unknown_listing_defers_to_runsc() {
        assert!(Features::default()
            .check_flags(&["--anything=1".into()])
            .is_ok());
    }
}
