//! Ids arrive from containerd and end up in file names and runsc's argv: check them first.

use crate::{Error, Result};

/// containerd's own limit for identifiers.
const MAX_LEN: usize = 76;

/// Accepts what containerd accepts for identifiers: alphanumeric runs joined by single
/// `.`, `_` or `-`. That rules out `/`, `..`, empty ids and leading dashes (no flag injection).
pub fn validate(kind: &'static str, value: &str) -> Result<()> {
    let fail = |reason| {
        Err(Error::InvalidId {
            kind,
            value: value.to_string(),
            reason,
        })
    };
    if value.is_empty() {
        return fail("must not be empty");
    }
    if value.len() > MAX_LEN {
        return fail("longer than 76 characters");
    }
    let mut previous_separator = true;
    for c in value.chars() {
        let separator = matches!(c, '.' | '_' | '-');
        if !(c.is_ascii_alphanumeric() || separator) {
            return fail("only letters, digits, '.', '_' and '-' are allowed");
        }
        if separator && previous_separator {
            return fail("separators must sit between letters or digits");
        }
        previous_separator = separator;
    }
    if previous_separator {
        return fail("must end with a letter or digit");
    }
    Ok(())
}

pub fn container_id(value: &str) -> Result<()> {
    validate("container id", value)
}

pub fn exec_id(value: &str) -> Result<()> {
    validate("exec id", value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_containerd_style_ids() {
        for id in ["a", "abc-123", "my.container_1", "0a1b2c", &"x".repeat(76)] {
            assert!(validate("id", id).is_ok(), "{id}");
        }
    }

    #[test]
    fn rejects_traversal_flags_and_junk() {
        for id in [
            "",
            "..",
            "../etc",
            "a/b",
            "-rf",
            "--root=/",
            "a..b",
            "a-",
            "with space",
            "é",
            &"x".repeat(77),
        ] {
            let err = validate("container id", id).unwrap_err().to_string();
            assert!(err.contains("invalid container id"), "{id}: {err}");
        }
    }
}
