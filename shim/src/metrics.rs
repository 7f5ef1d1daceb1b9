//! runsc's statistics as the cgroup v1 `Metrics` message containerd and CRI decode.

use chalk_runtime::stats::Stats;
use containerd_shim::protos::{
    cgroups::metrics::{CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat},
    protobuf::{well_known_types::any::Any, Message},
};

pub const METRICS_TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";

pub fn to_metrics(s: &Stats) -> Metrics {
    let entry = |e: &chalk_runtime::stats::MemoryEntry| {
        let mut m = MemoryEntry::new();
        m.limit = e.limit;
        m.usage = e.usage;
        m.max = e.max;
        m.failcnt = e.failcnt;
        m
    };
    let mut usage = CPUUsage::new();
    usage.total = s.cpu.usage.total;
    usage.user = s.cpu.usage.user;
    usage.kernel = s.cpu.usage.kernel;
    usage.per_cpu = s.cpu.usage.percpu.clone();
    let mut cpu = CPUStat::new();
    cpu.usage = Some(usage).into();

    let mut memory = MemoryStat::new();
    memory.cache = s.memory.cache;
    memory.usage = Some(entry(&s.memory.usage)).into();
    memory.swap = Some(entry(&s.memory.swap)).into();
    memory.kernel = Some(entry(&s.memory.kernel)).into();

    let mut pids = PidsStat::new();
    pids.current = s.pids.current;
    pids.limit = s.pids.limit;

    let mut m = Metrics::new();
    m.cpu = Some(cpu).into();
    m.memory = Some(memory).into();
    m.pids = Some(pids).into();
    m
}

pub fn to_any(s: &Stats) -> Result<Any, containerd_shim::protos::protobuf::Error> {
    let mut any = Any::new();
    any.type_url = METRICS_TYPE_URL.to_string();
    any.value = to_metrics(s).write_to_bytes()?;
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_cpu_memory_and_pids() {
        let ev = chalk_runtime::stats::parse(
            br#"{"type":"stats","id":"c","data":{"cpu":{"usage":{"total":5}},"memory":{"usage":{"limit":9,"usage":7}},"pids":{"current":3}}}"#,
        )
        .unwrap();
        let any = to_any(&ev.data).unwrap();
        assert_eq!(any.type_url, METRICS_TYPE_URL);
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.cpu.usage.total, 5);
        assert_eq!((m.memory.usage.usage, m.memory.usage.limit), (7, 9));
        assert_eq!(m.pids.current, 3);
    }
}
