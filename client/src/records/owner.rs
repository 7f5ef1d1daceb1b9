//! Which process is taking a snapshot, and whether it still lives: a record `in_progress`
//! whose taker is gone (chalkctl killed, the host rebooted) would read so for ever.

use crate::records::registry::Owner;

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string()).filter(|i| !i.is_empty())
}

/// The start time of process `pid` (field 22 of /proc/<pid>/stat), None without it.
fn start_time(pid: u32) -> Option<u64> {
    parse_start(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a /proc/<pid>/stat line; the command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_start(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process.
pub fn me() -> Option<Owner> {
    let pid = std::process::id();
    Some(Owner {
        boot: boot_id()?,
        pid,
        start: start_time(pid)?,
    })
}

/// Whether `o` still runs: same boot, and its pid is the same process (not a later one).
pub fn is_alive(o: &Owner) -> bool {
    boot_id().is_some_and(|b| b == o.boot) && start_time(o.pid) == Some(o.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_after_the_command_name() {
        let stat = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start(stat), Some(987654));
        assert_eq!(parse_start("garbage"), None);
    }

    #[test]
    fn this_process_lives_and_another_start_does_not() {
        let me = me().expect("this process");
        assert!(is_alive(&me));
        assert!(!is_alive(&Owner {
            start: me.start + 1,
            ..me.clone()
        }));
        assert!(!is_alive(&Owner {
            boot: "another-boot".into(),
            ..me.clone()
        }));
        let label = me.to_label();
        assert_eq!(Owner::parse(&label), Some(me));
        assert_eq!(Owner::parse("a/b"), None);
        assert_eq!(Owner::parse("boot/1/x"), None);
    }
}
