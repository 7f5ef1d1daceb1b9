//! What runsc gives back besides its exit status: `runsc wait`'s JSON result, and the reason
//! a command failed, read from its JSON log.

use std::path::Path;

use crate::{Error, Result};

/// Reads `runsc wait`'s JSON result.
pub fn parse_wait(out: &[u8]) -> Result<i32> {
    #[derive(serde::Deserialize)]
    struct WaitResult {
        #[serde(rename = "exitStatus")]
        exit_status: i32,
    }
    serde_json::from_slice::<WaitResult>(out)
        .map(|r| r.exit_status)
        .map_err(|e| Error::parse("runsc wait output", e))
}

/// What a runsc JSON log says went wrong: its error-level messages, first to last (the first
/// is usually the cause, the last what the command gave up on), else its last message.
pub fn last_error(log_file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log_file).ok()?;
    parse_errors(&text)
}

fn parse_errors(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Line {
        msg: String,
        #[serde(default)]
        level: String,
    }
    // runsc and the sandbox it starts append to one log, sometimes without a newline between.
    let lines: Vec<Line> = serde_json::Deserializer::from_str(text)
        .into_iter::<Line>()
        .map_while(|l| l.ok())
        .collect();
    let mut errors: Vec<&str> = Vec::new();
    for l in lines
        .iter()
        .filter(|l| l.level == "error" || l.level == "fatal")
    {
        if !errors.contains(&l.msg.as_str()) {
            errors.push(&l.msg);
        }
    }
    if !errors.is_empty() {
        return Some(errors.join("; "));
    }
    lines
        .last()
        .map(|l| l.msg.clone())
        .or_else(|| text.lines().last().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_results_are_read_from_runsc_wait() {
        assert_eq!(
            parse_wait(b"{\"id\":\"c1\",\"exitStatus\":137}\n").unwrap(),
            137
        );
        assert!(parse_wait(b"").is_err());
    }

    #[test]
    fn errors_are_read_from_runsc_logs() {
        let log = concat!(
            r#"{"msg":"starting","level":"info","time":"t"}"#,
            "\n",
            r#"{"msg":"reading spec: no such file","level":"error","time":"t"}"#,
            "\n",
            r#"{"msg":"exiting","level":"info","time":"t"}"#
        );
        assert_eq!(parse_errors(log).unwrap(), "reading spec: no such file");
        assert_eq!(
            parse_errors("plain text failure").unwrap(),
            "plain text failure"
        );
        assert!(parse_errors("").is_none());
        // Two processes' lines run together; the cause comes first.
        let joined = concat!(
            r#"{"msg":"unknown capability \"CAP_BOGUS\"","level":"error"}"#,
            r#"{"msg":"cannot create sandbox: EOF","level":"error"}"#,
            r#"{"msg":"cannot create sandbox: EOF","level":"error"}"#
        );
        assert_eq!(
            parse_errors(joined).unwrap(),
            r#"unknown capability "CAP_BOGUS"; cannot create sandbox: EOF"#
        );
    }
}
