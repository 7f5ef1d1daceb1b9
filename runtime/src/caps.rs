//! Capabilities of a non-root process as Linux leaves them after `execve`.
//!
//! runc sets the spec's capability sets and then execs the process; for a non-root user
//! without file capabilities the kernel then keeps only the ambient set in the permitted and
//! effective sets. gVisor starts a container's process with the spec's sets as they are, so a
//! user-1000 process would keep, say, `CAP_NET_BIND_SERVICE` that it has no right to under
//! runc. The shim narrows the spec first, so gVisor never grants more than runc does.

use serde_json::Value;

/// The capabilities containerd gives a container that asks for none (its default spec).
pub const CONTAINERD_DEFAULT: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Narrows `process` (an OCI process object) for a non-root user: permitted and effective
/// become the ambient capabilities that are also permitted. Returns whether it changed.
pub fn narrow_to_exec_semantics(process: &mut Value) -> bool {
    let uid = process.pointer("/user/uid").and_then(Value::as_u64);
    if uid.unwrap_or(0) == 0 {
        return false;
    }
    let Some(caps) = process
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    let names = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str().map(str::to_string))
            .collect()
    };
    let permitted = names(caps.get("permitted"));
    let kept: Vec<Value> = names(caps.get("ambient"))
        .into_iter()
        .filter(|c| permitted.contains(c))
        .map(Value::String)
        .collect();
    let mut changed = false;
    for set in ["permitted", "effective"] {
        let narrowed = Value::Array(kept.clone());
        if caps.get(set) != Some(&narrowed) {
            caps.insert(set.to_string(), narrowed);
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn process(uid: u64, ambient: &[&str]) -> Value {
        let all = ["CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_KILL"];
        json!({
            "user": {"uid": uid, "gid": uid},
            "capabilities": {
                "bounding": all, "permitted": all, "effective": all,
                "inheritable": [], "ambient": ambient,
            }
        })
    }

    #[test]
    fn non_root_keeps_only_ambient() {
        let mut p = process(1000, &[]);
        assert!(narrow_to_exec_semantics(&mut p));
        assert_eq!(p["capabilities"]["effective"], json!([]));
        assert_eq!(p["capabilities"]["permitted"], json!([]));
        assert_eq!(p["capabilities"]["bounding"].as_array().unwrap().len(), 3);

        let mut p = process(1000, &["CAP_NET_BIND_SERVICE"]);
        narrow_to_exec_semantics(&mut p);
        assert_eq!(
            p["capabilities"]["effective"],
            json!(["CAP_NET_BIND_SERVICE"])
        );
        assert!(!narrow_to_exec_semantics(&mut p), "idempotent");
    }

    #[test]
    fn never_widens() {
        let mut p = process(1000, &["CAP_SYS_ADMIN"]);
        narrow_to_exec_semantics(&mut p);
        assert_eq!(p["capabilities"]["effective"], json!([]));
    }

    #[test]
    fn root_and_capless_processes_are_untouched() {
        let mut p = process(0, &[]);
        assert!(!narrow_to_exec_semantics(&mut p));
        let mut p = json!({"args": ["sh"]});
        assert!(!narrow_to_exec_semantics(&mut p));
        let mut p = json!({"user": {"uid": 5}});
        assert!(!narrow_to_exec_semantics(&mut p));
    }
}
