//! Who may restore what: a snapshot is a sandbox's whole memory, so a pod starts only from a
//! snapshot its own namespace owns, or one an administrator shared with it, and a registry is
//! asked (with the node's credentials) only under the prefixes the administrator gave that
//! namespace. Pure: the shim applies it at Create, before anything of the snapshot is read.
//!
//! - **A node-store id** (`sha256:…`): a copy whose store ref is owned by the pod's namespace
//!   (taken from one of its pods, or pulled for one), or a digest shared with it.
//! - **`REF@sha256:…` under `[restore_from] registries`** (`{namespace}` is the pod's): the
//!   namespace's own area of the registry; the snapshot's manifest must not record another
//!   namespace as its owner. Always pulled, so the trust policy and the registry's own access
//!   control decide every time, even when the blobs are already on the node.
//! - **Under a `[[restore_from.shared]]` prefix, or a shared digest**: golden snapshots the
//!   administrator shares with the namespaces it lists.
//! - **`chalk.io/resume-from`**: only `suspend_to/NAMESPACE/POD@sha256:…` (agent-sandbox names
//!   a Sandbox's pod after it), recorded as taken by that Sandbox; and nothing under
//!   `suspend_to` is restored by `restore-from`.
//!
//! A refusal tells the pod which rule refused it, and nothing about a snapshot it does not own
//! (not even whether the node has it); the details go to the node's log.

use serde::{Deserialize, Serialize};

use super::{RestoreSource, RESUME_FROM};
use crate::registry_name::{canonical, covers};
use crate::snapshot::owner::Owner;

/// `[[restore_from.shared]]`: golden snapshots an administrator shares with namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// Snapshot ids (`sha256:…`): in this node's store, or in a registry under one of
    /// `prefixes` or the namespace's own `registries`.
    #[serde(default)]
    pub digests: Vec<String>,
    /// Registry prefixes (`host[:port]/path`) whose snapshots are shared.
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// The namespaces they are shared with (`"*"`: every namespace allowed at all).
    pub namespaces: Vec<String>,
}

/// The pod asking.
#[derive(Debug, Clone, Copy)]
pub struct Pod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Why a pod may restore what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Its namespace's own: a store copy owned by it, or a snapshot in its registry area.
    Own,
    /// Shared with its namespace by `[[restore_from.shared]]` #n (from 1).
    Shared(usize),
    /// Its own Sandbox's suspend (`chalk.io/resume-from`).
    Resume,
}

/// A refusal: the rule, for the pod's events; the details, for the node's log only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: String,
    pub detail: String,
}

impl Refusal {
    fn new(rule: impl Into<String>, detail: impl Into<String>) -> Refusal {
        Refusal {
            rule: rule.into(),
            detail: detail.into(),
        }
    }
}

/// The rule refusing a store id the namespace neither owns nor was given: the same whether the
/// node has the snapshot or not.
pub const NOT_OWNED: &str = "it is not a snapshot of this namespace on this node, nor one shared \
                             with it ([restore_from]: a pod restores only its namespace's own \
                             snapshots and those an administrator shares)";

/// The prefixes a namespace's registry references must be under.
pub fn registries_of(templates: &[String], namespace: &str) -> Vec<String> {
    templates
        .iter()
        .map(|t| t.replace("{namespace}", namespace))
        .collect()
}

/// The repository a pod's `resume-from` must name: its own Sandbox's under `suspend_to`.
pub fn own_repository(suspend_to: &str, pod: Pod) -> String {
    format!("{}/{}/{}", canonical(suspend_to), pod.namespace, pod.name)
}

fn shared_with<'a>(
    shared: &'a [Shared],
    namespace: &'a str,
) -> impl Iterator<Item = (usize, &'a Shared)> + 'a {
    shared
        .iter()
        .enumerate()
        .filter(move |(_, s)| s.namespaces.iter().any(|n| n == namespace || n == "*"))
        .map(|(i, s)| (i + 1, s))
}

/// Whether `pod` may restore `source` (named by annotation `key`), and on what ground, from
/// the options alone: what the store or the snapshot's manifest says is checked after
/// ([`owns_copy`], [`check_owner`]).
pub fn decide(
    opts: &super::RestoreFromOptions,
    key: &str,
    pod: Pod,
    source: &RestoreSource,
) -> Result<Grant, Refusal> {
    let ns = pod.namespace;
    let shared_digest = |id: &str| {
        shared_with(&opts.shared, ns)
            .find(|(_, s)| s.digests.iter().any(|d| d == id))
            .map(|(i, _)| i)
    };
    match source {
        RestoreSource::Local { id } if key == RESUME_FROM => Err(Refusal::new(
            format!(
                "{RESUME_FROM} names the pod's own Sandbox's snapshot in the registry \
                 (REF@sha256:…), never an id in a node's store"
            ),
            format!("{RESUME_FROM} {id} by pod {ns}/{}", pod.name),
        )),
        RestoreSource::Local { id } => Ok(shared_digest(id).map_or(Grant::Own, Grant::Shared)),
        RestoreSource::Remote { reference, id } if key == RESUME_FROM => {
            let Some(suspend_to) = &opts.suspend_to else {
                return Err(Refusal::new(
                    format!(
                        "this node resumes no Sandbox ({RESUME_FROM} needs [restore_from] \
                         suspend_to, the prefix the node agents suspend to)"
                    ),
                    format!("{reference}@{id}"),
                ));
            };
            let own = own_repository(suspend_to, pod);
            if canonical(reference) != own {
                return Err(Refusal::new(
                    format!("{RESUME_FROM} must name the pod's own Sandbox's repository, {own}"),
                    format!("{reference}@{id} named by pod {ns}/{}", pod.name),
                ));
            }
            Ok(Grant::Resume)
        }
        RestoreSource::Remote { reference, id } => {
            if let Some(s) = opts.suspend_to.as_deref().filter(|s| covers(s, reference)) {
                return Err(Refusal::new(
                    format!(
                        "{} is under [restore_from] suspend_to ({}), where each Sandbox's \
                         snapshots are its own: a Sandbox's pod resumes from them with \
                         {RESUME_FROM}",
                        canonical(reference),
                        canonical(s)
                    ),
                    format!("{reference}@{id} named by pod {ns}/{}", pod.name),
                ));
            }
            if let Some((i, _)) = shared_with(&opts.shared, ns)
                .find(|(_, s)| s.prefixes.iter().any(|p| covers(p, reference)))
            {
                return Ok(Grant::Shared(i));
            }
            let own = registries_of(&opts.registries, ns);
            if own.iter().any(|p| covers(p, reference)) {
                return Ok(shared_digest(id).map_or(Grant::Own, Grant::Shared));
            }
            let allowed: Vec<String> = own.iter().map(|p| canonical(p)).collect();
            Err(Refusal::new(
                format!(
                    "{} is outside the registry prefixes namespace {ns} may restore from \
                     ([restore_from] registries: {allowed:?}, and shared prefixes): the node's \
                     credentials are used for no other",
                    canonical(reference)
                ),
                format!("{reference}@{id} named by pod {ns}/{}", pod.name),
            ))
        }
    }
}

/// Whether namespace `namespace` owns one of a store snapshot's copies (their refs' owners).
pub fn owns_copy<'a>(owners: impl IntoIterator<Item = Option<&'a Owner>>, namespace: &str) -> bool {
    owners
        .into_iter()
        .any(|o| o.and_then(Owner::pod_namespace) == Some(namespace))
}

/// Checks what a snapshot's manifest records as its owner against the ground it was granted
/// on: a namespace's own registry snapshot must not be recorded as another namespace's, and
/// a resume must be of the pod's own Sandbox.
pub fn check_owner(grant: Grant, owner: Option<&Owner>, pod: Pod) -> Result<(), Refusal> {
    let recorded = owner.and_then(Owner::pod_namespace);
    let detail = || {
        format!(
            "its manifest's owner: {owner:?}; the pod: {}/{}",
            pod.namespace, pod.name
        )
    };
    match grant {
        Grant::Shared(_) => Ok(()),
        Grant::Own => match recorded {
            Some(ns) if ns != pod.namespace => Err(Refusal::new(
                "the snapshot is recorded as another namespace's (its manifest's owner)",
                detail(),
            )),
            _ => Ok(()),
        },
        Grant::Resume => {
            let sandbox = owner.and_then(Owner::sandbox);
            if recorded == Some(pod.namespace) && sandbox.is_none_or(|s| s == pod.name) {
                Ok(())
            } else {
                Err(Refusal::new(
                    "the snapshot is not recorded as this Sandbox's own suspend (its \
                     manifest's owner)",
                    detail(),
                ))
            }
        }
    }
}

/// Checks the policy's own fields: prefixes that are registry names, digests that are ids.
pub fn validate(opts: &super::RestoreFromOptions) -> Result<(), String> {
    let prefix = |what: &str, p: &str| -> Result<(), String> {
        let bare = p.replace("{namespace}", "ns");
        let ok = bare.contains('/')
            && !bare.contains(['@', ' ', '\t', '{', '}'])
            && !bare.split('/').any(|s| s.is_empty() || s == "..")
            && bare == bare.trim_end_matches('/');
        if ok {
            Ok(())
        } else {
            Err(format!(
                "[restore_from] {what} {p:?} is not a registry prefix (host[:port]/path, \
                 {{namespace}} for the pod's namespace, no tag, digest or trailing '/')"
            ))
        }
    };
    for r in &opts.registries {
        prefix("registries", r)?;
    }
    if let Some(s) = &opts.suspend_to {
        prefix("suspend_to", s)?;
    }
    for (i, s) in opts.shared.iter().enumerate() {
        for p in &s.prefixes {
            prefix(&format!("shared #{} prefixes", i + 1), p)?;
        }
        for d in &s.digests {
            if RestoreSource::parse(d).is_err() || d.contains('@') {
                return Err(format!(
                    "[[restore_from.shared]] #{} digest {d:?} is not a snapshot id \
                     (sha256:<64 hex digits>)",
                    i + 1
                ));
            }
        }
        if s.namespaces.is_empty() {
            return Err(format!(
                "[[restore_from.shared]] #{} shares with no namespace: list them in namespaces \
                 (\"*\" for all)",
                i + 1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{RestoreFromOptions, RESTORE_FROM};
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const G: &str = "sha256:feedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeedfeed";

    fn opts() -> RestoreFromOptions {
        RestoreFromOptions {
            enabled: true,
            namespaces: vec!["a".into(), "b".into()],
            registries: vec!["reg:5000/snaps/{namespace}".into()],
            suspend_to: Some("reg:5000/sandboxes".into()),
            shared: vec![Shared {
                digests: vec![G.into()],
                prefixes: vec!["reg:5000/golden".into()],
                namespaces: vec!["b".into()],
            }],
            ..Default::default()
        }
    }

    fn pod(ns: &'static str) -> Pod<'static> {
        Pod {
            namespace: ns,
            name: "p",
        }
    }

    fn remote(reference: &str, id: &str) -> RestoreSource {
        RestoreSource::Remote {
            reference: reference.into(),
            id: id.into(),
        }
    }

    #[test]
    fn a_namespace_restores_from_its_own_registry_area_only() {
        let o = opts();
        let own = remote("reg:5000/snaps/a/app", D);
        assert_eq!(decide(&o, RESTORE_FROM, pod("a"), &own), Ok(Grant::Own));
        // In another spelling of the same registry.
        let spelled = remote("REG:5000/snaps/a/app", D);
        assert_eq!(decide(&o, RESTORE_FROM, pod("a"), &spelled), Ok(Grant::Own));
        // B naming A's area, or a prefix that merely starts alike.
        let err = decide(&o, RESTORE_FROM, pod("b"), &own).unwrap_err();
        assert!(
            err.rule
                .contains("outside the registry prefixes namespace b"),
            "{err:?}"
        );
        assert!(err.rule.contains("reg:5000/snaps/b"), "{err:?}");
        let alike = remote("reg:5000/snaps/ab/app", D);
        assert!(decide(&o, RESTORE_FROM, pod("a"), &alike).is_err());
        // With no registries at all, no reference is accepted.
        let none = RestoreFromOptions {
            registries: Vec::new(),
            ..opts()
        };
        assert!(decide(&none, RESTORE_FROM, pod("a"), &own).is_err());
    }

    #[test]
    fn shared_snapshots_reach_the_namespaces_they_are_shared_with() {
        let o = opts();
        let golden = remote("reg:5000/golden/base", D);
        assert_eq!(
            decide(&o, RESTORE_FROM, pod("b"), &golden),
            Ok(Grant::Shared(1))
        );
        assert!(decide(&o, RESTORE_FROM, pod("a"), &golden).is_err());
        let local = RestoreSource::Local { id: G.into() };
        assert_eq!(
            decide(&o, RESTORE_FROM, pod("b"), &local),
            Ok(Grant::Shared(1))
        );
        assert_eq!(decide(&o, RESTORE_FROM, pod("a"), &local), Ok(Grant::Own));
        // A shared digest by reference needs a prefix the node's credentials may be used on.
        let elsewhere = remote("reg:5000/other/x", G);
        assert!(decide(&o, RESTORE_FROM, pod("b"), &elsewhere).is_err());
        let in_b = remote("reg:5000/snaps/b/x", G);
        assert_eq!(
            decide(&o, RESTORE_FROM, pod("b"), &in_b),
            Ok(Grant::Shared(1))
        );
    }

    #[test]
    fn a_sandbox_resumes_only_from_its_own_repository() {
        let o = opts();
        let own = remote("reg:5000/sandboxes/a/p", D);
        assert_eq!(decide(&o, RESUME_FROM, pod("a"), &own), Ok(Grant::Resume));
        let other = remote("reg:5000/sandboxes/a/q", D);
        let err = decide(&o, RESUME_FROM, pod("a"), &other).unwrap_err();
        assert!(err.rule.contains("reg:5000/sandboxes/a/p"), "{err:?}");
        // Another namespace's, by either annotation.
        assert!(decide(&o, RESUME_FROM, pod("b"), &own).is_err());
        let err = decide(&o, RESTORE_FROM, pod("a"), &own).unwrap_err();
        assert!(err.rule.contains("suspend_to"), "{err:?}");
        let local = RestoreSource::Local { id: D.into() };
        assert!(decide(&o, RESUME_FROM, pod("a"), &local).is_err());
        let off = RestoreFromOptions {
            suspend_to: None,
            ..opts()
        };
        let err = decide(&off, RESUME_FROM, pod("a"), &own).unwrap_err();
        assert!(err.rule.contains("suspend_to"), "{err:?}");
    }

    #[test]
    fn recorded_owners_decide_what_the_options_let_through() {
        let a = Owner::of_container(
            "k8s.io",
            &serde_json::json!({"annotations": {
                crate::snapshot::owner::CRI_SANDBOX_NAMESPACE: "a",
                crate::snapshot::owner::CRI_SANDBOX_NAME: "p"}}),
            Some("p"),
        );
        let b_pull = Owner::puller("k8s.io", Some("b"));
        let tool = Owner::puller("default", None);
        assert!(owns_copy([Some(&a), None], "a"));
        assert!(!owns_copy([Some(&a), Some(&tool), None], "b"));
        assert!(owns_copy([Some(&b_pull)], "b"));
        assert!(check_owner(Grant::Own, Some(&a), pod("a")).is_ok());
        assert!(check_owner(Grant::Own, Some(&tool), pod("b")).is_ok());
        assert!(check_owner(Grant::Own, None, pod("b")).is_ok());
        let err = check_owner(Grant::Own, Some(&a), pod("b")).unwrap_err();
        assert!(err.rule.contains("another namespace's"), "{err:?}");
        assert!(check_owner(Grant::Shared(1), Some(&a), pod("b")).is_ok());
        assert!(check_owner(Grant::Resume, Some(&a), pod("a")).is_ok());
        let other_sandbox = Pod {
            namespace: "a",
            name: "q",
        };
        assert!(check_owner(Grant::Resume, Some(&a), other_sandbox).is_err());
        assert!(check_owner(Grant::Resume, Some(&tool), pod("a")).is_err());
        assert!(check_owner(Grant::Resume, None, pod("a")).is_err());
    }

    #[test]
    fn bad_policies_name_the_field() {
        let bad = |o: RestoreFromOptions| validate(&o).unwrap_err();
        let e = bad(RestoreFromOptions {
            registries: vec!["reg:5000/snaps/{namespace}/".into()],
            ..opts()
        });
        assert!(e.contains("registries"), "{e}");
        let e = bad(RestoreFromOptions {
            suspend_to: Some("reg@sha256:x".into()),
            ..opts()
        });
        assert!(e.contains("suspend_to"), "{e}");
        let mut o = opts();
        o.shared[0].digests = vec!["latest".into()];
        assert!(bad(o).contains("digest"));
        let mut o = opts();
        o.shared[0].namespaces.clear();
        assert!(bad(o).contains("no namespace"));
        assert!(validate(&opts()).is_ok());
        assert_eq!(registries_of(&opts().registries, "a"), ["reg:5000/snaps/a"]);
    }
}
