//! The long-running processes: the master (`serve`, `up` with its local executor) and `executor`.

use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentos_engine::{DispatchConfig, JobConfig};
use agentos_executor::ExecutorConfig;
use agentos_executor::job::JobLimits;
use agentos_executor::sealed::SealedPolicy;

use crate::{ExecutorArgs, ServeArgs, output};

fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("AGENTOS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
}

/// The master runs on a multi-threaded runtime; an executor, whose work is waiting on
/// processes and sockets, on one thread, which spares it the hand-offs between threads.
fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the runtime: {e}");
        ExitCode::from(1)
    })
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(1)
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

/// `serve`, or `up` when `local_executor` gives the local executor's concurrency.
pub fn serve(args: ServeArgs, local_executor: Option<usize>) -> ExitCode {
    init_logging();
    agentos_executor::forbid_inspection();
    // jq expressions run in workers of this same binary, bounded in time and memory.
    let expr_timeout = Duration::from_millis(args.expr_timeout_ms.max(1));
    if let Err(e) = agentos_engine::sandbox::install_for_this_program(expr_timeout) {
        return fail(e);
    }
    let rt = match runtime(true) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let config = agentos_server::ServeConfig {
        data_dir: args.data.clone(),
        listen: args.listen.clone(),
        max_script_bytes: args.max_script_bytes,
        max_body_bytes: args.max_body_bytes,
        max_result_bytes: args.max_result_bytes,
        snapshot_every: args.snapshot_every,
        jobs: JobConfig {
            lease: Duration::from_millis(args.lease_ms.max(100)),
            max_attempts: args.max_attempts.max(1),
            ..JobConfig::default()
        },
        dispatch: DispatchConfig {
            inline_output_bytes: args.inline_output_bytes,
            default_timeout_ms: args.default_timeout_ms,
            max_timeout_ms: args.max_timeout_ms,
            no_executor_grace: Duration::from_millis(args.no_executor_grace_ms),
            ..DispatchConfig::default()
        },
        max_concurrent_invocations: args.max_concurrent_invocations,
        host_toolkits: Vec::new(),
        http_allow: args.http_allow.clone(),
        http_deny_private: args.http_deny_private,
    };
    rt.block_on(async move {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let stop_master = CancellationToken::new();
        let welcome = local_executor.is_some();
        let mut master = {
            let stop = stop_master.clone();
            tokio::spawn(agentos_server::run(
                config,
                move |ready| {
                    output::ready(ready, welcome);
                    let _ = ready_tx.send(ready.clone());
                },
                async move { stop.cancelled().await },
            ))
        };
        let stop_executor = CancellationToken::new();
        let mut executor = None;
        if let Some(concurrency) = local_executor {
            // A master that fails to start drops the sender; its error comes from the join below.
            if let Ok(ready) = ready_rx.await {
                match local_executor_config(&ready, &args, concurrency).await {
                    Ok(mut cfg) => {
                        // A first run as root from a private folder: scripts run as root rather than not at all.
                        if let Some((uid, _)) = cfg.limits.run_as
                            && let Err(why) = agentos_executor::workspace_reachable(&cfg.workspace, uid)
                        {
                            tracing::warn!(%why, "the local executor runs scripts as the current user (root): its workspace is not reachable by nobody");
                            cfg.limits.run_as = None;
                        }
                        if let SealedPolicy::Uids(range) = &cfg.limits.sealed
                            && let Err(why) = agentos_executor::workspace_reachable(&cfg.workspace, *range.start())
                        {
                            tracing::warn!(%why, "the local executor runs sealed jobs as the current user (root): its workspace is not reachable by other users");
                            cfg.limits.sealed = SealedPolicy::CurrentUser;
                        }
                        let stop = stop_executor.clone();
                        executor = Some(tokio::spawn(agentos_executor::run(cfg, async move { stop.cancelled().await })));
                    }
                    Err(e) => tracing::error!(error = %e, "the local executor could not start"),
                }
            }
        }
        let ended_early = tokio::select! {
            _ = shutdown_signal() => None,
            r = &mut master => Some(r),
        };
        // The executor stops first so that what it runs can still report to the master.
        stop_executor.cancel();
        if let Some(e) = executor {
            let _ = e.await;
        }
        stop_master.cancel();
        let result = match ended_early {
            Some(r) => r,
            None => master.await,
        };
        match result {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => fail(e),
            Err(e) => fail(format!("the master task failed: {e}")),
        }
    })
}

async fn local_executor_config(
    ready: &agentos_server::Ready,
    args: &ServeArgs,
    concurrency: usize,
) -> Result<ExecutorConfig, agentos_engine::EngineError> {
    let operator = ready.engine.operator().ok_or_else(|| agentos_core::CoreError::internal("no operator"))?;
    let token = ready.engine.create_executor_token(&operator, "local").await?;
    Ok(ExecutorConfig {
        master: ready.url.clone(),
        token,
        workspace: args.data.join("executor"),
        name: None,
        concurrency,
        limits: JobLimits {
            default_timeout: Duration::from_millis(args.default_timeout_ms),
            max_timeout: Duration::from_millis(args.max_timeout_ms),
            run_as: run_as(None).unwrap_or(None),
            // `up` is one person's machine: without root, sealed jobs run as that person, like
            // every other script does.
            sealed: if is_root() { SealedPolicy::Uids(DEFAULT_SEALED_UIDS) } else { SealedPolicy::CurrentUser },
            ..JobLimits::default()
        },
        grace: Duration::from_secs(30),
        poll_wait: Duration::from_secs(25),
    })
}

/// uid:gid of `nobody:nogroup`.
const NOBODY: (u32, u32) = (65534, 65534);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Parses `--run-as`; `None` keeps the executor's own user.
fn run_as(value: Option<&str>) -> Result<Option<(u32, u32)>, String> {
    match value {
        None if is_root() => Ok(Some(NOBODY)),
        None | Some("current") => Ok(None),
        Some("nobody") => Ok(Some(NOBODY)),
        Some(v) => {
            let parsed = v.split_once(':').and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
            parsed.map(Some).ok_or_else(|| format!("--run-as {v:?}: use nobody, current, or UID:GID"))
        }
    }
}

/// Sealed uids of an executor started as root without `--sealed-uids`. Far from the uids
/// distributions hand out (1000 up) and from nobody (65534).
const DEFAULT_SEALED_UIDS: std::ops::RangeInclusive<u32> = 61000..=61999;

/// Parses `--sealed-uids START-END`; without it, the default range as root, else the current
/// user when `--run-as current` was given, else sealed jobs are refused.
fn sealed_policy(value: Option<&str>, run_as: Option<&str>) -> Result<SealedPolicy, String> {
    match value {
        None if is_root() => Ok(SealedPolicy::Uids(DEFAULT_SEALED_UIDS)),
        None if run_as == Some("current") => Ok(SealedPolicy::CurrentUser),
        None => Ok(SealedPolicy::Refuse),
        Some(v) => {
            let parsed = v.split_once('-').and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
            match parsed {
                // 0 is root and u32::MAX is the "no uid" of chown and setuid.
                Some((start, end)) if start > 0 && start <= end && end < u32::MAX => {
                    Ok(SealedPolicy::Uids(start..=end))
                }
                _ => {
                    Err(format!("--sealed-uids {v:?}: use START-END, two uids with 0 < START <= END, e.g. 61000-61999"))
                }
            }
        }
    }
}

pub fn executor(args: ExecutorArgs) -> ExitCode {
    init_logging();
    let run_as = match run_as(args.run_as.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let sealed = match sealed_policy(args.sealed_uids.as_deref(), args.run_as.as_deref()) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let token = match (args.token, &args.token_file) {
        (Some(t), _) => t,
        (None, Some(f)) => match std::fs::read_to_string(f) {
            Ok(t) => t.trim().to_string(),
            Err(e) => return fail(format!("cannot read {}: {e}", f.display())),
        },
        (None, None) => return fail("no executor credential: give --token-file or AGENTOS_EXECUTOR_TOKEN"),
    };
    let rt = match runtime(false) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let config = ExecutorConfig {
        master: args.master,
        token,
        workspace: args.workspace,
        name: args.name,
        concurrency: args.concurrency,
        limits: JobLimits {
            default_timeout: Duration::from_millis(args.default_timeout_ms),
            max_timeout: Duration::from_millis(args.max_timeout_ms),
            max_output: args.max_output_bytes,
            path: args.path,
            run_as,
            sealed,
        },
        grace: Duration::from_millis(args.grace_ms),
        poll_wait: Duration::from_secs(25),
    };
    match rt.block_on(agentos_executor::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(value: &str, expected: Result<std::ops::RangeInclusive<u32>, ()>) {
        let got = sealed_policy(Some(value), None);
        match expected {
            Ok(r) => assert_eq!(got, Ok(SealedPolicy::Uids(r)), "{value}"),
            Err(()) => assert!(got.as_ref().is_err_and(|e| e.contains("use START-END")), "{value}: {got:?}"),
        }
    }

    #[test]
    fn sealed_uid_ranges_are_start_dash_end_without_root_or_the_no_uid() {
        check("61000-61999", Ok(61000..=61999));
        check("5-5", Ok(5..=5));
        check("0-10", Err(()));
        check("10-5", Err(()));
        check("61000", Err(()));
        check("a-b", Err(()));
        check("1-4294967295", Err(()));
        check("-5-10", Err(()));
    }
}
