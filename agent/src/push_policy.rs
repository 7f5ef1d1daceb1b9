//! Where a PodSnapshot may send a pod's memory with the node's credentials: under the
//! registry prefixes the administrator gave its namespace (`[restore_from] registries`, the
//! same that pods of the namespace may restore from), and never under `suspend_to`, where
//! each Sandbox's repository is the agents' own (a push there would land a stranger's
//! snapshot in another tenant's Sandbox repository). Pure.

use chalk_runtime::{
    pod_restore::{policy::registries_of, RestoreFromOptions},
    registry_name::{canonical, covers},
};

/// `reference` (`host/repo[:tag]`) without its tag.
fn repository(reference: &str) -> &str {
    match reference.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') && r.contains('/') => r,
        _ => reference,
    }
}

/// Refuses `push_to` for a PodSnapshot of namespace `namespace`, naming the rule.
pub fn check(opts: &RestoreFromOptions, namespace: &str, push_to: &str) -> Result<(), String> {
    let repo = repository(push_to);
    if push_to.contains('@') || !repo.contains('/') {
        return Err(format!(
            "pushTo {push_to:?} is not a registry reference (host[:port]/repository[:tag])"
        ));
    }
    if let Some(s) = opts.suspend_to.as_deref().filter(|s| covers(s, repo)) {
        return Err(format!(
            "pushTo {} is under the Sandboxes' repositories ({}), which only the agents write",
            canonical(repo),
            canonical(s)
        ));
    }
    let allowed = registries_of(&opts.registries, namespace);
    if allowed.iter().any(|p| covers(p, repo)) {
        return Ok(());
    }
    Err(format!(
        "pushTo {} is outside the registry prefixes namespace {namespace} may use ({:?}: \
         [restore_from] registries in the node's runtime options)",
        canonical(repo),
        allowed.iter().map(|p| canonical(p)).collect::<Vec<_>>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RestoreFromOptions {
        RestoreFromOptions {
            registries: vec!["reg:5000/snaps/{namespace}".into()],
            suspend_to: Some("reg:5000/sandboxes".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_namespace_pushes_only_into_its_own_area() {
        assert!(check(&opts(), "a", "reg:5000/snaps/a/web:v1").is_ok());
        assert!(check(&opts(), "a", "reg:5000/snaps/a/web").is_ok());
        let err = check(&opts(), "b", "reg:5000/snaps/a/web:v1").unwrap_err();
        assert!(
            err.contains("outside") && err.contains("namespace b"),
            "{err}"
        );
        let err = check(&opts(), "a", "reg:5000/sandboxes/a/sb:s1").unwrap_err();
        assert!(err.contains("only the agents write"), "{err}");
        assert!(check(&opts(), "a", "reg:5000/snaps/a/web@sha256:ab").is_err());
        assert!(check(&RestoreFromOptions::default(), "a", "reg:5000/snaps/a/w").is_err());
    }
}
