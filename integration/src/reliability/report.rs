//! RELIABILITY.md from result lines: the e2e and travel suites' fault cases
//! (`$CHALK_RESULTS`), the bad-input tests, the load cases and the soak, per cell.

use std::collections::BTreeMap;

use serde_json::Value;

/// What a case is and what the product promises in it.
struct Promise {
    case: &'static str,
    section: &'static str,
    what: &'static str,
}

const FAULTS: &str = "Faults";
const BAD_INPUT: &str = "Bad input";
const LOAD: &str = "Load";

const PROMISES: &[Promise] = &[
    Promise { case: "fault_shim_killed_at_each_stage_of_a_snapshot_fails_cleanly", section: FAULTS,
        what: "The shim SIGKILLed before runsc's checkpoint, while the checkpoint is sealed, while it is stored: the snapshot reads `failed` with a reason, the source is cleanly gone with its exit reported, containerd's `shim delete` leaves nothing (no runsc process, state, mount, cgroup, bundle, ingest, lease)." },
    Promise { case: "fault_shim_or_sandbox_killed_mid_checkpoint_fail_cleanly", section: FAULTS,
        what: "The shim, or runsc's sandbox process, SIGKILLed during runsc's checkpoint: the same." },
    Promise { case: "fault_shim_or_sandbox_killed_during_a_restore_leaves_no_fork", section: FAULTS,
        what: "A fork's shim SIGKILLed at Create (restore verified), before runsc's restore and once restored; its runsc sandbox killed during the restore: the fork fails with a message and is removed whole; the snapshot forks again; the source runs on; nothing left (restore links, containerd's unpacked copy, cgroups)." },
    Promise { case: "fault_chalkctl_killed_mid_snapshot_is_settled", section: FAULTS,
        what: "chalkctl SIGKILLed mid-snapshot: the next chalkctl command completes the record from the store or fails it with why; never `in_progress` for ever; the source runs on." },
    Promise { case: "fault_chalkctl_killed_mid_suspend_is_settled", section: FAULTS,
        what: "chalkctl SIGKILLed mid-suspend: the record settles; the sandbox reads suspended and resumes with its memory, or runs on." },
    Promise { case: "fault_containerd_restarted_mid_snapshot_fork_and_suspend", section: FAULTS,
        what: "containerd SIGKILLed and restarted during a snapshot, a fork and a suspend: the sandboxes run on and answer, records settle, a half-made fork is removed whole, a completed suspend resumes, no lease is left." },
    Promise { case: "fault_containerd_restarted_with_twenty_sandboxes", section: FAULTS,
        what: "containerd SIGKILLed and restarted with 20 sandboxes running: all 20 still run, answer, pause, snapshot and delete; lifetimes still end on time." },
    Promise { case: "fault_two_snapshots_at_once_are_serialized_or_refused", section: FAULTS,
        what: "Two snapshots of one sandbox at once: serialized by the shim or refused with a message; each completed one forks." },
    Promise { case: "fault_delete_while_forking_is_never_corrupt", section: FAULTS,
        what: "A snapshot deleted while a fork of it restores: the fork runs (and snapshots again) or fails and is gone; every recorded snapshot opens whole." },
    Promise { case: "fault_resume_racing_a_delete_ends_one_way", section: FAULTS,
        what: "A resume racing a delete of the suspended sandbox: it ends running or gone, never a task without its container." },
    Promise { case: "failed_snapshot_never_costs_the_source", section: FAULTS,
        what: "Disk full for a checkpoint: refused before the sandbox is touched, with the figures; with the check off, runsc's ENOSPC half-way fails it and the source runs on (or, on runsc builds that stop it, is cleanly gone with its exit)." },
    Promise { case: "failed_checkpoint_leaves_the_source_running", section: FAULTS,
        what: "A checkpoint that fails in runsc leaves the source running and its directory empty." },
    Promise { case: "dead_shim_is_cleaned_up", section: FAULTS,
        what: "A shim killed with a sandbox running: containerd's cleanup ends the sandbox and reports its exit." },
    Promise { case: "fault_disk_full_during_a_pull_fails_cleanly_and_pulls_after", section: FAULTS,
        what: "The snapshot store's disk full during a pull: it fails naming the disk, nothing partial is left in the store, and the same pull succeeds once there is room." },
    Promise { case: "fault_registry_full_during_a_push_fails_cleanly_and_resumes", section: FAULTS,
        what: "The registry's disk full during a push: it fails with the registry's error, the local snapshot is whole, and a push once there is room sends only what is missing." },
    Promise { case: "fault_registry_gone_mid_push_and_mid_pull", section: FAULTS,
        what: "The registry killed mid-push and mid-pull: each fails naming the registry, nothing half-made is left, and each resumes once it is back (blobs already sent are not sent again)." },
    Promise { case: "tampered_snapshots_are_refused", section: BAD_INPUT,
        what: "A snapshot whose files, manifest or links were changed (a truncated file, a symlink in the checkpoint, a changed hash) is refused before runsc sees it." },
    Promise { case: "restore_is_pinned_to_the_image_digest", section: BAD_INPUT,
        what: "A restore onto another image (by digest) is refused, naming both." },
    Promise { case: "bad_options_are_named", section: BAD_INPUT,
        what: "A wrong runtime option (unknown key, bad value) fails Create naming the key." },
    Promise { case: "bad_spec_fails_at_create_with_runscs_reason", section: BAD_INPUT,
        what: "A spec runsc refuses fails Create with runsc's reason." },
    Promise { case: "chalkctl_refuses_what_it_cannot_fork", section: BAD_INPUT,
        what: "chalkctl refuses a fork it cannot make (unknown or failed snapshot, bad id, taken id) with what to do." },
    Promise { case: "manifest_bytes_never_panic", section: BAD_INPUT,
        what: "Any bytes as a manifest: an error, never a panic (property test)." },
    Promise { case: "any_json_is_a_manifest_or_an_error", section: BAD_INPUT,
        what: "Any JSON as a manifest: parsed or an error (property test)." },
    Promise { case: "a_changed_field_is_named", section: BAD_INPUT,
        what: "A manifest field of the wrong type: the error names the field's path (property test)." },
    Promise { case: "a_file_name_outside_the_snapshot_is_refused", section: BAD_INPUT,
        what: "A file name that climbs out of the snapshot (`../`, absolute) is refused (property test)." },
    Promise { case: "ids_are_checked_without_panic", section: BAD_INPUT,
        what: "Any container id: accepted or refused by containerd's rules, never a panic (property test)." },
    Promise { case: "image_references_split_without_panic", section: BAD_INPUT,
        what: "Any image reference and digest: parsed or refused (property test)." },
    Promise { case: "lifetime_annotations_are_named_when_wrong", section: BAD_INPUT,
        what: "A wrong `chalk.io/lifetime` or `chalk.io/on-timeout` annotation is refused by name (property test)." },
    Promise { case: "options_text_never_panics", section: BAD_INPUT,
        what: "Any text as the runtime options file: options or an error (property test)." },
    Promise { case: "a_wrong_option_is_named", section: BAD_INPUT,
        what: "A runtime option of the wrong type: the error names it (property test)." },
    Promise { case: "malicious_manifests_are_refused_by_name", section: BAD_INPUT,
        what: "Oversized (over 4 MiB), deeply nested, 100000-file, duplicate-name, traversal and bad-hash manifests: refused by name before runsc sees them." },
    Promise { case: "an_oci_manifest_naming_a_file_twice_or_too_many_is_refused", section: BAD_INPUT,
        what: "A pulled OCI manifest naming a file twice, or more files than the bound: refused by name." },
    Promise { case: "load_fifty_sandboxes_at_once", section: LOAD,
        what: "50 sandboxes started 8 at a time: all run and answer; all removed leave nothing." },
    Promise { case: "load_sixteen_concurrent_forks_of_one_snapshot", section: LOAD,
        what: "16 forks of one snapshot at once: every fork runs and counts on from it." },
    Promise { case: "load_eight_concurrent_snapshots", section: LOAD,
        what: "8 sandboxes snapshotted at once: every snapshot completes and opens whole; every source runs on." },
];

/// A case's name without its module path (`bad_input::tests::x` is `x`).
fn short(case: &str) -> &str {
    case.rsplit("::").next().unwrap_or(case)
}

/// One result's cell of the table.
fn outcome(r: &Value) -> String {
    let secs = r["seconds"].as_f64().unwrap_or(0.0);
    let notes: Vec<&str> = r["notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let text = if r["passed"].as_bool() == Some(true) {
        let mut s = format!("pass ({secs:.1} s)");
        if !notes.is_empty() {
            s.push_str(": ");
            s.push_str(&notes.join("; "));
        }
        s
    } else {
        format!(
            "**FAIL** ({secs:.1} s): {}",
            r["failure"].as_str().unwrap_or("no reason recorded")
        )
    };
    text.replace('|', "\\|").replace('\n', " ")
}

/// The report: `results` (every line of every run), `meta` (one line per cell: its
/// containerd and runsc), `when` (the date of the run).
pub fn render(results: &[Value], meta: &[Value], when: &str) -> String {
    let mut cells: Vec<String> = meta
        .iter()
        .filter_map(|m| m["cell"].as_str().map(String::from))
        .collect();
    for r in results {
        let c = r["cell"].as_str().unwrap_or("").to_string();
        if !cells.contains(&c) {
            cells.push(c);
        }
    }
    // The last result of each (case, cell) counts.
    let mut by_case: BTreeMap<(String, String), &Value> = BTreeMap::new();
    for r in results {
        let case = short(r["case"].as_str().unwrap_or("")).to_string();
        let cell = r["cell"].as_str().unwrap_or("").to_string();
        by_case.insert((case, cell), r);
    }
    let mut out = String::new();
    out.push_str("# Reliability\n\n");
    out.push_str(
        "What chalk-shim promises under faults, load and bad input, and what a run measured. \
         Generated by `scripts/reliability` (the fault and bad-input cases also run in every \
         `scripts/test`; `--soak` adds the load cases and the soak); do not edit by hand.\n\n",
    );
    out.push_str(&format!("Run of {when}.\n\n"));
    out.push_str("| cell | containerd | runsc |\n|---|---|---|\n");
    for m in meta {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            m["cell"].as_str().unwrap_or(""),
            m["containerd"].as_str().unwrap_or(""),
            m["runsc"].as_str().unwrap_or("")
        ));
    }
    let total = by_case.len();
    let failed = by_case
        .values()
        .filter(|r| r["passed"].as_bool() != Some(true))
        .count();
    out.push_str(&format!(
        "\n{} results, {} passed, {} failed.\n",
        total,
        total - failed,
        failed
    ));
    for section in [FAULTS, BAD_INPUT, LOAD] {
        // The cells this section has results of (unit tests have a cell of their own).
        let cells: Vec<&String> = cells
            .iter()
            .filter(|c| {
                PROMISES
                    .iter()
                    .filter(|p| p.section == section)
                    .any(|p| by_case.contains_key(&(p.case.to_string(), (*c).clone())))
            })
            .collect();
        if cells.is_empty() {
            continue;
        }
        out.push_str(&format!("\n## {section}\n\n| case | promise |"));
        for c in &cells {
            out.push_str(&format!(" {c} |"));
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|".repeat(cells.len()));
        out.push('\n');
        for p in PROMISES.iter().filter(|p| p.section == section) {
            let row: Vec<String> = cells
                .iter()
                .map(|c| {
                    by_case
                        .get(&(p.case.to_string(), (*c).clone()))
                        .map_or_else(|| "not run".to_string(), |r| outcome(r))
                })
                .collect();
            if row.iter().all(|r| r == "not run") {
                continue;
            }
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                p.case,
                p.what,
                row.join(" | ")
            ));
        }
    }
    soak_section(&mut out, results, &cells);
    let known: Vec<&str> = PROMISES.iter().map(|p| p.case).collect();
    let others: Vec<&(String, String)> = by_case
        .keys()
        .filter(|(case, _)| !known.contains(&case.as_str()) && case != "soak")
        .collect();
    if !others.is_empty() {
        let failed: Vec<&&(String, String)> = others
            .iter()
            .filter(|k| by_case[**k]["passed"].as_bool() != Some(true))
            .collect();
        out.push_str(&format!(
            "\n## The rest of the suites in this run\n\n{} other results (the e2e and travel \
             suites' other cases), {} passed.\n",
            others.len(),
            others.len() - failed.len()
        ));
        for key in failed {
            out.push_str(&format!(
                "- `{}` ({}): {}\n",
                key.0,
                key.1,
                outcome(by_case[*key])
            ));
        }
    }
    out
}

/// Every soak of the run, each cell's in order (a soak may be run again after a fix: a
/// `label` says which is which).
fn soak_section(out: &mut String, results: &[Value], cells: &[String]) {
    let soaks: Vec<(&String, &Value)> = cells
        .iter()
        .flat_map(|c| {
            results
                .iter()
                .filter(move |r| r["case"] == "soak" && r["cell"] == c.as_str())
                .map(move |r| (c, r))
        })
        .collect();
    out.push_str("\n## Soak\n\n");
    if soaks.is_empty() {
        out.push_str("Not run (`scripts/reliability --soak`).\n");
        return;
    }
    out.push_str(
        "Each cycle: run a sandbox, snapshot it, fork the snapshot, suspend and resume the fork, \
         delete both and their snapshots. Every 25 cycles a long-lived sandbox (its shim lives \
         through the soak) is snapshotted, timed, and the snapshot deleted, and the measures \
         below are sampled; a measure grows \
         when its second half's mean and its last sample pass its first half's by 10% and a \
         floor (2 fds or processes, 8 MB of RSS, 16 MB of disk).\n\n",
    );
    for (cell, r) in soaks {
        out.push_str(&format!(
            "### {cell}{}: {} cycles, {}\n\n{:.1} s a cycle (slowest {:.1} s), {:.0} s in all.\n\n",
            r["label"]
                .as_str()
                .map_or(String::new(), |l| format!(", {l}")),
            r["cycles"],
            if r["passed"].as_bool() == Some(true) {
                "passed".to_string()
            } else {
                format!(
                    "**FAILED**: {}",
                    r["failure"].as_str().unwrap_or("no reason recorded")
                )
            },
            r["seconds_per_cycle"].as_f64().unwrap_or(0.0),
            r["slowest_cycle_seconds"].as_f64().unwrap_or(0.0),
            r["seconds"].as_f64().unwrap_or(0.0)
        ));
        let samples: Vec<&Value> = r["samples"].as_array().into_iter().flatten().collect();
        if samples.is_empty() {
            continue;
        }
        out.push_str("| after cycle | long-lived snapshot | shim RSS | shim fds | containerd RSS | containerd fds | content store | snapshot store | containerd's directory (not its log) | runsc processes |\n|---|---|---|---|---|---|---|---|---|---|\n");
        let mb = |v: &Value| {
            v.as_u64()
                .map_or("-".into(), |b| format!("{:.1} MB", b as f64 / 1e6))
        };
        let n = |v: &Value| v.as_u64().map_or("-".into(), |x| x.to_string());
        // At most about a dozen rows: the first, the last and evenly between.
        let step = samples.len().div_ceil(12).max(1);
        for (i, s) in samples.iter().enumerate() {
            if i % step != 0 && i + 1 != samples.len() {
                continue;
            }
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                s["cycle"],
                s["base_snapshot_ms"]
                    .as_u64()
                    .filter(|ms| *ms > 0)
                    .map_or("-".into(), |ms| format!("{:.2} s", ms as f64 / 1000.0)),
                mb(&s["shim_rss"]),
                n(&s["shim_fds"]),
                mb(&s["containerd_rss"]),
                n(&s["containerd_fds"]),
                mb(&s["content_bytes"]),
                mb(&s["store_bytes"]),
                mb(&s["disk_bytes"]),
                n(&s["runsc_processes"])
            ));
        }
        out.push('\n');
        if samples.iter().all(|s| s["log_bytes"].is_null()) {
            out.push_str("- containerd's directory includes containerd's log in this soak (it was not counted apart yet)\n");
        }
        let logged = |s: &Value| s["log_bytes"].as_u64();
        if let (Some(a), Some(b), Some(cycles)) = (
            samples.first().and_then(|s| logged(s)),
            samples.last().and_then(|s| logged(s)),
            samples
                .last()
                .and_then(|s| s["cycle"].as_u64())
                .filter(|c| *c > 0),
        ) {
            out.push_str(&format!(
                "- containerd's log (debug level, the shims' lines in it) grew {:.1} KB a cycle\n",
                b.saturating_sub(a) as f64 / cycles as f64 / 1e3
            ));
        }
        for note in r["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            out.push_str(&format!("- {note}\n"));
        }
        out.push('\n');
    }
}

/// Result lines from libtest's plain output (`test path ... ok|FAILED`), for `cell`.
pub fn from_libtest(output: &str, cell: &str) -> Vec<Value> {
    output
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("test ")?;
            let (name, status) = rest.rsplit_once(" ... ")?;
            let passed = match status.trim() {
                "ok" => true,
                "FAILED" => false,
                _ => return None,
            };
            Some(serde_json::json!({
                "case": name.trim(),
                "cell": cell,
                "passed": passed,
                "seconds": 0.0,
                "notes": [],
                "failure": (!passed).then_some("see the test's output"),
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_case_is_a_row_with_a_column_per_cell() {
        let results = vec![
            json!({"case": "fault_two_snapshots_at_once_are_serialized_or_refused", "cell": "debian",
                   "passed": true, "seconds": 3.2, "notes": ["1 of 2 completed, the other refused"]}),
            json!({"case": "fault_two_snapshots_at_once_are_serialized_or_refused", "cell": "current",
                   "passed": false, "seconds": 9.0, "failure": "neither | completed"}),
            json!({"case": "bad_input::tests::manifest_bytes_never_panic", "cell": "all", "passed": true, "seconds": 0.0}),
            json!({"case": "something_new", "cell": "debian", "passed": true, "seconds": 1.0}),
        ];
        let meta = vec![
            json!({"cell": "debian", "containerd": "1.6.20", "runsc": "2022"}),
            json!({"cell": "current", "containerd": "2.4.2", "runsc": "2026"}),
        ];
        let md = render(&results, &meta, "2026-12-01");
        assert!(md.contains("| debian | 1.6.20 | 2022 |"));
        assert!(
            md.contains("pass (3.2 s): 1 of 2 completed, the other refused"),
            "{md}"
        );
        assert!(
            md.contains("**FAIL** (9.0 s): neither \\| completed"),
            "{md}"
        );
        assert!(md.contains("`manifest_bytes_never_panic`"));
        assert!(
            md.contains("1 other results"),
            "unknown cases are counted: {md}"
        );
        assert!(
            md.contains("| case | promise | all |"),
            "a section has its own cells: {md}"
        );
        assert!(md.contains("4 results, 3 passed, 1 failed"), "{md}");
        assert!(md.contains("Not run (`scripts/reliability --soak`)"));
        assert!(
            !md.contains("fault_registry_gone"),
            "a case never run has no row"
        );
    }

    #[test]
    fn the_soak_shows_its_samples_and_verdicts() {
        let soak = json!({"case": "soak", "cell": "debian", "passed": true, "seconds": 100.0,
            "cycles": 50, "seconds_per_cycle": 2.0, "slowest_cycle_seconds": 3.5,
            "notes": ["shim_fds: 20 at the start, 20 at the end (max 22): flat"],
            "samples": [{"cycle": 0, "shim_rss": 30000000u64, "shim_fds": 20}, {"cycle": 50, "shim_rss": 31000000u64, "shim_fds": 20}]});
        let md = render(&[soak], &[], "today");
        assert!(md.contains("### debian: 50 cycles, passed"), "{md}");
        assert!(md.contains("| 50 | - | 31.0 MB | 20 |"), "{md}");
        assert!(md.contains("- shim_fds: 20 at the start"), "{md}");
    }

    #[test]
    fn libtest_lines_become_results() {
        let out = "running 2 tests\ntest bad_input::tests::a ... ok\ntest b ... FAILED\ntest c ... ignored\n";
        let r = from_libtest(out, "all");
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["case"], "bad_input::tests::a");
        assert_eq!(r[1]["passed"], false);
    }
}
