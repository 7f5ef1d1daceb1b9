//! Small readers over OCI runtime spec JSON shared by the modules that inspect specs.

use serde_json::Value;

/// The strings of a JSON array (a capability set, args, env); empty when absent.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_string_arrays_and_skips_the_rest() {
        assert_eq!(strings(&serde_json::json!(["a", 1, "b"])), ["a", "b"]);
        assert!(strings(&Value::Null).is_empty());
    }
}
