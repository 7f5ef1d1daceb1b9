//! End-to-end tests: a private containerd (Debian's, or `CHALK_CONTAINERD`), the real runsc and
//! the chalk shim, driven through containerd's own `ctr` and gRPC API. Nothing is faked. One
//! file per area under e2e/; the cases share one containerd (see `chalk_integration::testkit`).

// What every area file takes with `use super::*`.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use chalk_integration::{
    cases,
    containerd::IMAGE,
    ensure,
    testkit::{self, Env, Failed, TestResult, COUNTER},
    Containerd, CtrOutput, RUNTIME,
};

#[path = "e2e/lifecycle.rs"]
mod lifecycle;

#[path = "e2e/terminal.rs"]
mod terminal;

#[path = "e2e/failures.rs"]
mod failures;

#[path = "e2e/snapshots.rs"]
mod snapshots;

#[path = "e2e/chalkctl.rs"]
mod chalkctl;

#[path = "e2e/hooks.rs"]
mod hooks;

#[path = "e2e/gpu.rs"]
mod gpu;

#[path = "e2e/forktree.rs"]
mod forktree;
#[path = "e2e/store.rs"]
mod store;

#[path = "e2e/faults.rs"]
mod faults;

#[path = "e2e/nerdctl.rs"]
mod nerdctl;

#[path = "e2e/cli.rs"]
mod cli;

#[path = "e2e/debian.rs"]
mod debian;

fn main() {
    testkit::check_args();
    let c = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    c.import_busybox()
        .unwrap_or_else(|e| panic!("cannot import the busybox image: {e}"));
    let mut all = cases![
        lifecycle::run_rm_echo,
        lifecycle::exit_code_is_exact,
        lifecycle::kill_gives_128_plus_signal,
        lifecycle::wait_returns_status_and_exit_time,
        lifecycle::output_is_never_lost,
        lifecycle::stdin_reaches_the_process_and_close_io_ends_it,
        lifecycle::binary_log_uri_feeds_a_logging_binary,
        lifecycle::exec_has_its_own_status_and_output,
        lifecycle::non_root_processes_get_no_effective_capabilities,
        lifecycle::kill_all_stops_every_process,
        lifecycle::pause_resume_and_pids,
        lifecycle::metrics_report_sandbox_usage,
        lifecycle::update_changes_the_sandbox_limits,
        terminal::tty_and_resize,
        lifecycle::events_cover_the_lifecycle,
        lifecycle::oom_is_reported,
        failures::bad_process_fails_with_reason_and_leaves_nothing,
        failures::bad_spec_fails_at_create_with_runscs_reason,
        failures::missing_or_broken_runsc_is_a_clear_error,
        failures::bad_options_are_named,
        failures::runsc_debug_log_when_asked,
        failures::shim_logs_reach_containerd,
        failures::dead_shim_is_cleaned_up,
        failures::a_shim_without_containerd_stays_idle,
        snapshots::snapshot_keeps_the_source_and_forks_continue,
        snapshots::suspend_releases_the_sandbox_and_resume_continues,
        snapshots::tampered_snapshots_are_refused,
        snapshots::restore_is_pinned_to_the_image_digest,
        snapshots::failed_checkpoint_leaves_the_source_running,
        snapshots::failed_snapshot_never_costs_the_source,
        forktree::fork_tree_four_levels_deep,
        forktree::lifetime_destroys_or_suspends_and_forks_inherit_it,
        forktree::lifetime_survives_a_containerd_restart,
        forktree::fork_count_is_pooled_and_leaves_nothing_behind,
        forktree::defaults_work_without_an_options_file,
        store::snapshots_are_blobs_restored_in_place,
        terminal::terminal_signals_size_and_settings_survive_a_restore,
        terminal::a_snapshot_does_not_cut_ctrs_terminal,
        chalkctl::chalkctl_snapshot_registry,
        chalkctl::chalkctl_suspend_and_resume,
        chalkctl::chalkctl_refuses_what_it_cannot_fork,
        cli::cli_terminal_session_run_attach_fork_logs_rm,
        cli::cli_exec_run_options_and_wait,
        cli::cli_names_snapshot_wait_and_rm_of_a_suspended_sandbox,
        hooks::hooks_run_around_a_snapshot_and_in_each_fork,
        hooks::failing_hooks_abort_the_checkpoint_or_fail_the_restore,
        hooks::fork_identity_example_gives_each_fork_its_own,
        gpu::gpu_standin_handoff_around_snapshot_fork_and_resume,
        gpu::gpu_standin_failures_leave_every_process_running,
        faults::fault_chalkctl_killed_mid_snapshot_is_settled,
        faults::fault_chalkctl_killed_mid_suspend_is_settled,
        faults::fault_shim_or_sandbox_killed_mid_checkpoint_fail_cleanly,
        faults::fault_two_snapshots_at_once_are_serialized_or_refused,
        faults::fault_containerd_restarted_mid_snapshot_fork_and_suspend,
        faults::fault_delete_while_forking_is_never_corrupt,
        faults::fault_resume_racing_a_delete_ends_one_way,
        faults::fault_shim_killed_at_each_stage_of_a_snapshot_fails_cleanly,
        faults::fault_forks_run_while_their_snapshot_is_sealed,
        faults::fault_shim_or_sandbox_killed_during_a_restore_leaves_no_fork,
        faults::fault_containerd_restarted_with_twenty_sandboxes,
        debian::debian_workload_carries_on_across_snapshot_fork_and_suspend,
        debian::debian_git_project_forks_three_ways,
    ];
    // A test of an optional peer is listed as ignored, never passed, when the peer is absent.
    let no_nerdctl = std::env::var_os("CHALK_NERDCTL").is_none_or(|v| v.is_empty());
    all.extend(
        cases![nerdctl::nerdctl_runs_sandboxes]
            .into_iter()
            .map(|c| c.ignored_if(no_nerdctl)),
    );
    testkit::run(Env { c }, all, |e| {
        // Whatever the cases did, no restore may leave its unpacked checkpoint (the sandbox's
        // memory) in containerd's temporary directory.
        let (killed, left): (Vec<_>, Vec<_>) =
            e.c.unpacked_checkpoints()
                .into_iter()
                .partition(|(dir, _)| Containerd::left_by_a_kill(dir));
        if !killed.is_empty() {
            println!(
                "note: containerd was killed between unpacking a restore's pointer and starting \
                 its shim, leaving {killed:?} (the shim sweeps them later)"
            );
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "containerd's temporary directory keeps unpacked checkpoints: {left:?}"
            ))
        }
    })
}
