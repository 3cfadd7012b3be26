//! The long-running processes: the master (`serve`, `up` with its local executor) and `executor`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentos_engine::bindings::mcp::{McpConfig, ServerUser};
use agentos_engine::{DispatchConfig, JobConfig};
use agentos_executor::ExecutorConfig;
use agentos_executor::job::JobLimits;
use agentos_executor::sealed::SealedPolicy;
use agentos_server::LooseDataFolder;

use crate::{ExecutorArgs, ServeArgs, UpArgs, output};

/// The log's filter unless `AGENTOS_LOG` sets one. The MCP library logs each session it opens
/// at info and each JSON-RPC error it answers, with the client's words, at warn: one line per
/// client request, which a client could use to fill the log; so does its HTTP server for each
/// stream past 32 on a session and each resume with a bad `Last-Event-ID`. Its errors stay.
const DEFAULT_LOG: &str = "info,rmcp=warn,rmcp::service=error,rmcp::transport::streamable_http_server=error";

fn init_logging() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTOS_LOG").unwrap_or_else(|_| DEFAULT_LOG.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes are for a person at a terminal; in a file (`agentos up 2> log`) or a
        // pipe they are noise that breaks grep.
        .with_ansi(std::io::stderr().is_terminal())
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
        errln!("error: cannot start the runtime: {e}");
        ExitCode::from(1)
    })
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    errln!("error: {e}");
    ExitCode::from(1)
}

/// An option that can never work, refused before anything starts: exit 2, as clap's own.
fn usage(e: impl std::fmt::Display) -> ExitCode {
    errln!("error: {e}");
    ExitCode::from(crate::call::EXIT_USAGE)
}

/// `agentos export`: the data folder of a stopped master to one file.
pub fn export(data: &Path, out: Option<PathBuf>) -> ExitCode {
    let out = out.unwrap_or_else(|| agentos_server::migrate::default_export_file(data));
    let rt = match runtime(false) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(agentos_server::migrate::export(data, &out)) {
        Ok(m) => {
            outln!("exported {} events, {} blobs and {} open jobs to {}", m.events, m.blobs, m.jobs, out.display());
            errln!(
                "the secrets key is not in the export: give every master {} with --secrets-key-file, and copy {} into each master's data folder",
                data.join("secrets.key").display(),
                data.join("operator.token").display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `agentos import`: an export into PostgreSQL and an S3 bucket.
pub fn import(file: &Path, database: &str, blobs: &str) -> ExitCode {
    let rt = match runtime(true) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(agentos_server::migrate::import(file, database, blobs)) {
        Ok(m) => {
            let resumed = if m.events_present > 0 {
                format!(" ({} events were there from an earlier run)", m.events_present)
            } else {
                String::new()
            };
            outln!(
                "imported {} events, {} blobs (each read back and verified) and {} open jobs{resumed}",
                m.events,
                m.blobs,
                m.jobs
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
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

/// What `agentos up` runs beside its master.
struct LocalExecutor {
    concurrency: usize,
    workspace: PathBuf,
    /// The user scripts run as; `None` only when `--run-as current` asked for the master's own.
    run_as: Option<(u32, u32)>,
}

/// `agentos serve`: a master that refuses a data folder open to other users.
pub fn serve(args: ServeArgs) -> ExitCode {
    init_logging();
    run_master(args, LooseDataFolder::Refuse, None)
}

/// Who MCP command servers run as: `--mcp-run-as`, else the local executor's scripts' user
/// (`agentos up`), else nobody as root; without root and without either, they are refused.
fn mcp_user(args: &ServeArgs, local: Option<&LocalExecutor>) -> Result<ServerUser, String> {
    let chosen = match args.mcp_run_as.as_deref() {
        Some("current") => return Ok(ServerUser::Current),
        Some(v) => run_as(Some(v)).map_err(|e| e.replace("--run-as", "--mcp-run-as"))?,
        None => match local {
            Some(l) => return Ok(l.run_as.map_or(ServerUser::Current, |(u, g)| ServerUser::Uid(u, g))),
            None if is_root() => Some(NOBODY),
            None => return Ok(ServerUser::Refused),
        },
    };
    Ok(chosen.map_or(ServerUser::Refused, |(u, g)| ServerUser::Uid(u, g)))
}

/// `agentos up`: a master that tightens its data folder, and a local executor whose scripts
/// run as a user of their own, decided before anything starts.
pub fn up(args: UpArgs) -> ExitCode {
    init_logging();
    let local = match local_executor(&args) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    run_master(args.serve, LooseDataFolder::Tighten, Some(local))
}

/// `<data>.work`, beside the data folder and never inside it: the scripts' user must enter the
/// workspace, and must not enter the data folder, which is the master's alone (0700).
fn local_workspace(data: &Path) -> Result<PathBuf, String> {
    let absolute = std::path::absolute(data).map_err(|e| format!("--data {}: {e}", data.display()))?;
    let name = absolute.file_name().ok_or_else(|| {
        format!("--data {}: name a folder; the local executor's workspace goes beside it", data.display())
    })?;
    let mut work = name.to_os_string();
    work.push(".work");
    Ok(absolute.with_file_name(work))
}

fn local_executor(args: &UpArgs) -> Result<LocalExecutor, String> {
    let data = &args.serve.data;
    let workspace = local_workspace(data)?;
    // Refused before the master starts, as the executor itself would refuse it after: a master
    // without its executor would queue every script call for nobody.
    if let Some(why) = agentos_executor::workspace_unsafe(&workspace) {
        return Err(format!(
            "the local executor's workspace {} (the folder beside --data) is not safe to use: {why}; or move it away and let agentos up make it, or choose another --data",
            workspace.display()
        ));
    }
    let run_as = local_run_as(args.run_as.as_deref(), data, &workspace)?;
    Ok(LocalExecutor { concurrency: args.executor_concurrency, workspace, run_as })
}

/// Who the local executor's scripts run as. Never the master's own user unless `--run-as
/// current` says so: such a script could read the event log, the secrets key and the
/// operator token. Refused with what to do, rather than run as that user behind one's back.
fn local_run_as(flag: Option<&str>, data: &Path, workspace: &Path) -> Result<Option<(u32, u32)>, String> {
    let uid = effective_uid();
    let data = data.display();
    if flag == Some("current") {
        tracing::warn!(
            uid,
            data = %data,
            "--run-as current: scripts run as the master's own user and can read everything in its data folder, the operator token and secrets key included"
        );
        return Ok(None);
    }
    let can_switch = is_root();
    let user = match run_as(flag)? {
        Some(user) if can_switch && user.0 != uid => user,
        Some((other, _)) if other != uid => {
            return Err(format!(
                "--run-as {}: running scripts as uid {other} needs agentos to run as root (it runs as uid {uid}). Run `agentos up` as root, or give --run-as current to run scripts as uid {uid}, which lets them read everything in {data}",
                flag.unwrap_or_default()
            ));
        }
        Some(_) => {
            return Err(format!(
                "--run-as {}: that is the master's own user, whose scripts can read everything in {data}; give --run-as current if that is what you want",
                flag.unwrap_or_default()
            ));
        }
        None => {
            return Err(format!(
                "the local executor has no user of its own to run scripts as: agentos runs as uid {uid}, not root, so it cannot run them as nobody. Run `agentos up` as root (scripts then run as nobody), or give --run-as current to run them as uid {uid}, which lets them read everything in {data}"
            ));
        }
    };
    let closed = agentos_executor::folders_closed_to(workspace, user.0)?;
    if !closed.is_empty() {
        let folders: Vec<String> = closed.iter().rev().map(|(d, _)| d.display().to_string()).collect();
        let modes: Vec<String> = closed.iter().rev().map(|(d, m)| format!("{} is {m:o}", d.display())).collect();
        return Err(format!(
            "scripts run as uid {}, who cannot reach the local executor's workspace {} ({}). Let them enter with `chmod o+x {}`, choose a --data whose folder others may enter, or give --run-as current to run scripts as the master's own user, which lets them read everything in {data}",
            user.0,
            workspace.display(),
            modes.join(", "),
            folders.join(" "),
        ));
    }
    Ok(Some(user))
}

fn run_master(args: ServeArgs, loose_data_folder: LooseDataFolder, local: Option<LocalExecutor>) -> ExitCode {
    agentos_executor::forbid_inspection();
    // jq expressions run in workers of this same binary, bounded in time and memory.
    let expr_timeout = Duration::from_millis(args.expr_timeout_ms.max(1));
    let rt = match runtime(true) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let mcp_run_as = match mcp_user(&args, local.as_ref()) {
        Ok(u) => u,
        Err(e) => return fail(e),
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
            store_after: Duration::from_millis(args.store_after_ms),
            ..DispatchConfig::default()
        },
        max_concurrent_invocations: args.max_concurrent_invocations,
        host_toolkits: Vec::new(),
        http_allow: args.http_allow.clone(),
        http_deny_private: args.http_deny_private,
        mcp_endpoint: agentos_server::McpEndpoint {
            list_limit: args.mcp_list_limit,
            session_idle: Duration::from_millis(args.mcp_session_idle_ms),
        },
        mcp: McpConfig {
            run_as: mcp_run_as,
            idle_stop: Duration::from_millis(args.mcp_idle_ms.max(1)),
            ..McpConfig::default()
        },
        docker: agentos_engine::bindings::docker::DockerConfig {
            registry: args.docker_registry.clone(),
            socket: args.docker_socket.clone(),
            idle_stop: Duration::from_millis(args.docker_idle_ms.max(1)),
            start_timeout: Duration::from_millis(args.docker_start_timeout_ms.max(1)),
            max_containers: args.max_containers.max(1),
            ..Default::default()
        },
        loose_data_folder,
        connections: agentos_server::ConnectionLimits {
            max_connections: args.max_connections.max(1),
            header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        },
        skip_events: args.skip_events.clone(),
        storage: agentos_server::Storage {
            database: args.database.clone(),
            blobs: args.blobs.clone(),
            secrets_key_file: args.secrets_key_file.clone(),
        },
        net_limits: agentos_engine::NetLimits {
            max_tokens_per_place: args.max_tokens_per_place,
            max_outputs_per_fire: args.max_outputs_per_fire,
            max_token_bytes: args.max_token_bytes,
            max_fires_per_second: args.max_fires_per_second,
            max_memory_bytes: args.max_memory_mb.map_or_else(agentos_engine::nets::default_memory_cap, |mb| mb << 20),
            firing_marker: None,
        },
        expressions: agentos_server::Expressions::Workers { timeout: expr_timeout },
    };
    rt.block_on(async move {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let stop_master = CancellationToken::new();
        let welcome = local.as_ref().map(|l| output::LocalWelcome {
            workspace: l.workspace.clone(),
            run_as: l.run_as.map(|user| match user {
                NOBODY => "nobody".to_string(),
                (uid, gid) => format!("uid {uid}, gid {gid}"),
            }),
        });
        let mut master = {
            let stop = stop_master.clone();
            tokio::spawn(agentos_server::run(
                config,
                move |ready| {
                    output::ready(ready, welcome.as_ref());
                    let _ = ready_tx.send(ready.clone());
                },
                async move { stop.cancelled().await },
            ))
        };
        let stop_executor = CancellationToken::new();
        let mut executor = None;
        if let Some(local) = local {
            // A master that fails to start drops the sender; its error comes from the join below.
            if let Ok(ready) = ready_rx.await {
                match local_executor_config(&ready, &args, local).await {
                    Ok(mut cfg) => {
                        // Sealed jobs need uids that can enter the workspace; without that they
                        // fail with the reason rather than run as the master's user.
                        if let SealedPolicy::Uids(range) = &cfg.limits.sealed
                            && let Err(why) = agentos_executor::workspace_reachable(&cfg.workspace, *range.start())
                        {
                            tracing::warn!(%why, "the local executor refuses jobs that carry secrets: the sealed uids cannot reach its workspace");
                            cfg.limits.sealed = SealedPolicy::Refuse;
                        }
                        let stop = stop_executor.clone();
                        executor = Some(tokio::spawn(async move {
                            // Said at once: a master without its executor would only time out invocations.
                            if let Err(e) = agentos_executor::run(cfg, async move { stop.cancelled().await }).await {
                                tracing::error!(error = %e, "the local executor stopped");
                            }
                        }));
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
    local: LocalExecutor,
) -> Result<ExecutorConfig, agentos_engine::EngineError> {
    let operator = ready.engine.operator().ok_or_else(|| agentos_core::CoreError::internal("no operator"))?;
    let token = ready.engine.dispatch().create_executor_token(&operator, "local").await?;
    Ok(ExecutorConfig {
        master: ready.url.clone(),
        token: token.clone(),
        workspace: local.workspace,
        name: None,
        concurrency: local.concurrency,
        limits: JobLimits {
            default_timeout: Duration::from_millis(args.default_timeout_ms),
            max_timeout: Duration::from_millis(args.max_timeout_ms),
            run_as: local.run_as,
            // Without root, `up` runs only with --run-as current: sealed jobs then run as that
            // user, like every other script does.
            sealed: if is_root() { SealedPolicy::Uids(DEFAULT_SEALED_UIDS) } else { SealedPolicy::CurrentUser },
            ..JobLimits::default()
        },
        grace: Duration::from_secs(30),
        poll_wait: Duration::from_secs(25),
        // It runs in the master's own process: direct calls, not HTTP to itself.
        direct: Some(agentos_executor::protocol::Direct(std::sync::Arc::new(crate::local_link::LocalLink::new(
            ready.engine.clone(),
            token,
            args.max_result_bytes,
        )))),
    })
}

/// uid:gid of `nobody:nogroup`.
const NOBODY: (u32, u32) = (65534, 65534);

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn is_root() -> bool {
    effective_uid() == 0
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
    // A master's address that can never work is refused at start: it used to be retried for
    // ever, each poll logging "cannot reach the master: builder error".
    let masters = args.master.split(',').map(str::trim).filter(|m| !m.is_empty());
    if let Some(why) = masters.clone().find_map(|m| crate::call::not_a_master(m, "--master (or AGENTOS_URL)")) {
        return usage(why);
    }
    if masters.count() == 0 {
        return usage("--master (or AGENTOS_URL) names no master; set it like http://127.0.0.1:7420");
    }
    if args.default_timeout_ms > args.max_timeout_ms {
        return usage(format!(
            "--default-timeout-ms {} is above --max-timeout-ms {}: a job that names no timeout could never run its default",
            args.default_timeout_ms, args.max_timeout_ms
        ));
    }
    let run_as = match run_as(args.run_as.as_deref()) {
        Ok(r) => r,
        Err(e) => return usage(e),
    };
    let sealed = match sealed_policy(args.sealed_uids.as_deref(), args.run_as.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
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
        direct: None,
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
