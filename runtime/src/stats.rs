//! The statistics `runsc events --stats` prints: the sandbox's own accounting, which is what the
//! container sees (host cgroups only see the sentry).

use serde::Deserialize;

use crate::{Error, Result};

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StatsEvent {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub data: Stats,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Stats {
    #[serde(default)]
    pub cpu: Cpu,
    #[serde(default)]
    pub memory: Memory,
    #[serde(default)]
    pub pids: Pids,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Cpu {
    #[serde(default)]
    pub usage: CpuUsage,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CpuUsage {
    #[serde(default)]
    pub total: u64,
    #[serde(default)]
    pub user: u64,
    #[serde(default)]
    pub kernel: u64,
    #[serde(default)]
    pub percpu: Vec<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Memory {
    #[serde(default)]
    pub cache: u64,
    #[serde(default)]
    pub usage: MemoryEntry,
    #[serde(default)]
    pub swap: MemoryEntry,
    #[serde(default)]
    pub kernel: MemoryEntry,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MemoryEntry {
    #[serde(default)]
    pub limit: u64,
    #[serde(default)]
    pub usage: u64,
    #[serde(default)]
    pub max: u64,
    #[serde(default)]
    pub failcnt: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pids {
    #[serde(default)]
    pub current: u64,
    #[serde(default)]
    pub limit: u64,
}

/// Parses the first JSON object runsc printed.
pub fn parse(output: &[u8]) -> Result<StatsEvent> {
    let text = String::from_utf8_lossy(output);
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| Error::parse("runsc events output", "it was empty"))?;
    serde_json::from_str(line).map_err(|e| Error::parse("runsc events output", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runsc_2022_output() {
        let out = br#"{"type":"stats","id":"t5","data":{"cpu":{"usage":{"total":109114583}},"memory":{"usage":{"limit":0,"usage":2027520,"failcnt":0},"swap":{"limit":0,"failcnt":0},"kernel":{"limit":0,"failcnt":0},"kernelTCP":{"limit":0,"failcnt":0}},"pids":{"current":1}}}
"#;
        let ev = parse(out).unwrap();
        assert_eq!(ev.id, "t5");
        assert_eq!(ev.data.cpu.usage.total, 109114583);
        assert_eq!(ev.data.memory.usage.usage, 2027520);
        assert_eq!(ev.data.pids.current, 1);
    }

    #[test]
    fn empty_output_is_an_error() {
        assert!(parse(b"\n").is_err());
    }
}
