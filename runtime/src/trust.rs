//! `[trust]` and `[encryption]` of the runtime options: which keys may sign the snapshots a
//! node pulls, per registry or repository prefix, and where the node's decryption keys are.
//!
//! ```toml
//! [trust]
//! default = "refuse"                      # references no rule's scope covers
//! [[trust.rules]]
//! scope = "registry.example:5000/agents"  # a registry, or a registry/repository prefix
//! keys = ["/etc/chalk/trust/agents.pub"]  # PEM public keys (P-256, as cosign's)
//! unsigned = "refuse"                     # the default where keys are named
//! [encryption]
//! identities = "/etc/chalk/snapshot.key"  # age identities, owner-only (chalkctl snapshot keygen)
//! ```
//!
//! The most specific scope decides: `reg:5000/a/b` is covered by `reg:5000/a` and by
//! `reg:5000`, not by `reg:5000/ab`. Scopes and references are compared in one form
//! ([`crate::registry_name`]): `Reg.Example:443/a` is `reg.example/a`.
//!
//! Without `default`, a node that lets pods start from snapshots (`[restore_from] enabled`)
//! refuses what no rule covers: no registry snapshot reaches a pod unless the administrator
//! said which may. Elsewhere (a workstation's chalkctl) the default is to allow, as before
//! policies existed.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    #[default]
    Allow,
    Refuse,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustOptions {
    /// What happens to a snapshot no rule covers; unset: see [`TrustOptions::with_default`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Verdict>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Set by [`TrustOptions::with_default`] when the refusal of what no rule covers is
    /// implied by `[restore_from]` rather than written: its refusals say how to allow.
    #[serde(skip)]
    pub implied: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub scope: String,
    /// Public keys whose signature lets a snapshot in; none with `unsigned = "refuse"`
    /// refuses everything in scope.
    #[serde(default)]
    pub keys: Vec<PathBuf>,
    #[serde(default = "refuse")]
    pub unsigned: Verdict,
}

fn refuse() -> Verdict {
    Verdict::Refuse
}

/// `[encryption]`: the keys this node decrypts snapshots with.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionOptions {
    /// An age identity file (0600, owner root): none, and encrypted snapshots are refused.
    #[serde(default)]
    pub identities: Option<PathBuf>,
}

impl EncryptionOptions {
    pub fn validate(&self) -> Result<(), String> {
        match &self.identities {
            Some(p) if !p.is_absolute() => Err(format!(
                "[encryption] identities must be an absolute path, got {p:?}"
            )),
            _ => Ok(()),
        }
    }
}

/// What the policy asks of one snapshot reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement<'a> {
    /// No rule covers it, and the default lets it in.
    Open,
    /// No rule covers it, and the default refuses it (`implied`: by `[restore_from]`, as no
    /// default is written).
    Closed { implied: bool },
    /// Rule `index` (of `[[trust.rules]]`, from 1) covers it.
    Rule { index: usize, rule: &'a Rule },
}

impl TrustOptions {
    pub fn validate(&self) -> Result<(), String> {
        for (i, r) in self.rules.iter().enumerate() {
            let at = format!("[[trust.rules]] #{} (scope {:?})", i + 1, r.scope);
            let scope = r.scope.trim_end_matches('/');
            if scope.is_empty()
                || scope != r.scope
                || scope.contains("//")
                || scope.contains(['@', ' ', '\t'])
                || scope
                    .split('/')
                    .next()
                    .is_some_and(|h| h.contains(':') && h.ends_with(':'))
            {
                return Err(format!(
                    "{at}: scope must be a registry host[:port], optionally with a repository \
                     prefix (registry.example:5000/team), without a trailing '/', tag or digest"
                ));
            }
            if let Some(k) = r.keys.iter().find(|k| !k.is_absolute()) {
                return Err(format!("{at}: key {k:?} must be an absolute path"));
            }
            if let Some(j) = self.rules[..i].iter().position(|o| o.scope == r.scope) {
                return Err(format!("{at}: rule #{} has the same scope", j + 1));
            }
        }
        Ok(())
    }

    /// The policy in effect on a node that does (`restores_pods`) or does not let pods start
    /// from snapshots: an unset default refuses on such a node, and allows elsewhere.
    pub fn with_default(&self, restores_pods: bool) -> TrustOptions {
        let mut t = self.clone();
        if t.default.is_none() {
            t.default = Some(if restores_pods {
                Verdict::Refuse
            } else {
                Verdict::Allow
            });
            t.implied = restores_pods;
        }
        t
    }

    /// The rule with the most specific scope covering `registry`/`repository`.
    pub fn requirement(&self, registry: &str, repository: &str) -> Requirement<'_> {
        let name = format!("{registry}/{repository}");
        let best = self
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| crate::registry_name::covers(&r.scope, &name))
            .max_by_key(|(_, r)| crate::registry_name::canonical(&r.scope).len());
        match best {
            Some((i, rule)) => Requirement::Rule { index: i + 1, rule },
            None if self.default == Some(Verdict::Refuse) => Requirement::Closed {
                implied: self.implied,
            },
            None => Requirement::Open,
        }
    }

    /// Whether any snapshot pulled at all needs its signatures looked at.
    pub fn is_open(&self) -> bool {
        self.rules.is_empty() && self.default != Some(Verdict::Refuse)
    }
}

impl Requirement<'_> {
    /// The policy line that decided, as a refusal names it.
    pub fn describe(&self) -> String {
        match self {
            Requirement::Open => "[trust] default = \"allow\"".into(),
            Requirement::Closed { implied: false } => {
                "[trust] default = \"refuse\" (no [[trust.rules]] scope covers it)".into()
            }
            Requirement::Closed { implied: true } => {
                "no [[trust.rules]] scope covers it, and a node that starts pods from snapshots \
                 ([restore_from] enabled) refuses what no rule covers unless [trust] says \
                 otherwise: add a [[trust.rules]] with its registry or repository as scope and \
                 the keys that sign it (or unsigned = \"allow\"), or set [trust] default = \
                 \"allow\""
                    .into()
            }
            Requirement::Rule { index, rule } => format!(
                "[[trust.rules]] #{index} (scope {:?}, keys [{}], unsigned = \"{}\")",
                rule.scope,
                rule.keys
                    .iter()
                    .map(|k| k.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                match rule.unsigned {
                    Verdict::Allow => "allow",
                    Verdict::Refuse => "refuse",
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> TrustOptions {
        #[derive(Deserialize)]
        struct Doc {
            trust: TrustOptions,
        }
        let t = toml::from_str::<Doc>(text).unwrap().trust;
        t.validate().unwrap();
        t
    }

    #[test]
    fn the_most_specific_scope_decides() {
        let t = policy(
            r#"
            [trust]
            [[trust.rules]]
            scope = "reg:5000"
            unsigned = "allow"
            [[trust.rules]]
            scope = "reg:5000/team"
            keys = ["/k/team.pub"]
            "#,
        );
        let index = |repo: &str| match t.requirement("reg:5000", repo) {
            Requirement::Rule { index, .. } => index,
            other => panic!("{other:?}"),
        };
        assert_eq!(index("team"), 2);
        assert_eq!(index("team/web"), 2);
        assert_eq!(index("teammate"), 1);
        assert_eq!(index("other"), 1);
        assert_eq!(t.requirement("elsewhere", "team"), Requirement::Open);
        // Another spelling of the same registry is the same scope.
        assert_eq!(index_of(&t, "REG:5000", "team/web"), 2);
        let Requirement::Rule { rule, .. } = t.requirement("reg:5000", "team") else {
            unreachable!()
        };
        assert_eq!(rule.unsigned, Verdict::Refuse, "refuse is the default");
        assert!(t.requirement("reg:5000", "team").describe().contains("#2"));
    }

    fn index_of(t: &TrustOptions, registry: &str, repo: &str) -> usize {
        match t.requirement(registry, repo) {
            Requirement::Rule { index, .. } => index,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_closed_default_refuses_what_no_rule_covers() {
        let t = policy("[trust]\ndefault = \"refuse\"\n");
        assert_eq!(
            t.requirement("reg", "x"),
            Requirement::Closed { implied: false }
        );
        assert!(!t.is_open());
        assert!(TrustOptions::default().is_open());
    }

    #[test]
    fn a_node_that_restores_pods_refuses_unless_told_otherwise() {
        let unset = TrustOptions::default();
        let pods = unset.with_default(true);
        let closed = pods.requirement("reg", "x");
        assert_eq!(closed, Requirement::Closed { implied: true });
        assert!(closed.describe().contains("[[trust.rules]]"));
        assert!(closed.describe().contains("default = \"allow\""));
        assert_eq!(
            unset.with_default(false).requirement("reg", "x"),
            Requirement::Open
        );
        let written = policy("[trust]\ndefault = \"allow\"\n");
        assert_eq!(
            written.with_default(true).requirement("reg", "x"),
            Requirement::Open
        );
    }

    #[test]
    fn bad_input_policies_name_what_is_wrong() {
        let bad = |text: &str| {
            #[derive(Deserialize)]
            struct Doc {
                #[allow(dead_code)]
                trust: TrustOptions,
            }
            match toml::from_str::<Doc>(text) {
                Err(e) => e.to_string(),
                Ok(d) => d.trust.validate().unwrap_err(),
            }
        };
        let e = bad("[trust]\n[[trust.rules]]\nscope = \"reg/\"\n");
        assert!(e.contains("without a trailing '/'"), "{e}");
        let e = bad("[trust]\n[[trust.rules]]\nscope = \"reg\"\nkeys = [\"k.pub\"]\n");
        assert!(e.contains("absolute path"), "{e}");
        let e =
            bad("[trust]\n[[trust.rules]]\nscope = \"reg\"\n[[trust.rules]]\nscope = \"reg\"\n");
        assert!(e.contains("same scope"), "{e}");
        let e = bad("[trust]\n[[trust.rules]]\nscope = \"reg\"\nunsigned = \"maybe\"\n");
        assert!(e.contains("unknown variant"), "{e}");
        let e = bad("[trust]\n[[trust.rules]]\nscope = \"reg\"\nkey = \"/k\"\n");
        assert!(e.contains("unknown field"), "{e}");
        let e = EncryptionOptions {
            identities: Some("key.txt".into()),
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("absolute"), "{e}");
    }
}
