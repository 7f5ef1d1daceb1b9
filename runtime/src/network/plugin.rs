//! Runs one CNI plugin binary: the command and the sandbox in its environment, its
//! configuration on stdin, its result (or error) on stdout.

use std::{
    io::{Read, Write},
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::runsc::Spawner;

/// ADD or DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Del,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
        }
    }
}

/// Who the plugin works for.
pub struct Target<'a> {
    pub container_id: &'a str,
    pub netns: &'a Path,
    pub ifname: &'a str,
    /// CNI_PATH: where a plugin finds the plugins it delegates to (its IPAM).
    pub search: &'a str,
}

/// Runs `binary` for `op` with `input`; its result (ADD) or Null (DEL). An error names the
/// plugin and carries its own message. Started through `spawner` (the shim reaps every child
/// itself).
pub fn run(
    spawner: &dyn Spawner,
    binary: &Path,
    op: Op,
    target: &Target,
    input: &Value,
) -> Result<Value, String> {
    let kind = input["type"].as_str().unwrap_or("?");
    let io =
        |what: &str, e: std::io::Error| format!("CNI plugin {}: {what}: {e}", binary.display());
    // The input is small (a configuration and a result): the pipe holds it whole, so it is
    // written before the plugin starts.
    let (stdin, mut feed) = std::io::pipe().map_err(|e| io("pipe", e))?;
    feed.write_all(input.to_string().as_bytes())
        .map_err(|e| io("write its input", e))?;
    drop(feed);
    let (mut errors, errors_in) = std::io::pipe().map_err(|e| io("pipe", e))?;
    let mut cmd = Command::new(binary);
    cmd.env("CNI_COMMAND", op.as_str())
        .env("CNI_CONTAINERID", target.container_id)
        .env("CNI_NETNS", target.netns)
        .env("CNI_IFNAME", target.ifname)
        .env("CNI_PATH", target.search)
        // The plugins run iptables and sysctl: the shim's environment may lack sbin.
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(errors_in);
    let mut child = spawner.spawn(&mut cmd).map_err(|e| io("run", e))?;
    // Our copies of the pipes' other ends go, so that reads end with the plugin.
    drop(cmd);
    let stderr = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = errors.read_to_end(&mut text);
        text
    });
    let mut stdout = Vec::new();
    if let Some(mut out) = child.take_stdout() {
        let _ = out.read_to_end(&mut stdout);
    }
    let status = child.wait().map_err(|e| io("wait", e))?;
    let stderr = stderr.join().unwrap_or_default();
    if status != 0 {
        return Err(format!(
            "CNI plugin {kind} {}: {}",
            op.as_str(),
            failure_message(&stdout, &stderr)
        ));
    }
    if op == Op::Del || stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&stdout).map_err(|e| {
        format!(
            "CNI plugin {kind} {}: its result is not JSON: {e}",
            op.as_str()
        )
    })
}

/// A plugin's error, as the CNI spec shapes it (`{"code", "msg", "details"}`), or its raw
/// output when it is not.
fn failure_message(stdout: &[u8], stderr: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(stdout) {
        if let Some(msg) = v["msg"].as_str() {
            return match v["details"].as_str().filter(|d| !d.is_empty()) {
                Some(d) => format!("{msg} ({d})"),
                None => msg.to_string(),
            };
        }
    }
    let text = [stdout, stderr]
        .iter()
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        "it failed and said nothing".into()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugins_error_is_read_from_its_json() {
        let m = failure_message(
            br#"{"code":7,"msg":"no IP addresses available","details":"range full"}"#,
            b"",
        );
        assert_eq!(m, "no IP addresses available (range full)");
        assert_eq!(failure_message(b"", b"boom\n"), "boom");
        assert_eq!(failure_message(b"", b""), "it failed and said nothing");
    }
}
