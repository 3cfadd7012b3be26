//! The long-running processes: the master (`serve`, `up` with its local executor) and `executor`.

use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentos_engine::{DispatchConfig, JobConfig};
use agentos_executor::job::JobLimits;
use agentos_executor::ExecutorConfig;

use crate::{output, ExecutorArgs, ServeArgs};

fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("AGENTOS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
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
    use tokio::signal::unix::{signal, SignalKind};
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
    let rt = match runtime() {
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
            ..DispatchConfig::default()
        },
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
                    Ok(cfg) => {
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
            ..JobLimits::default()
        },
        grace: Duration::from_secs(30),
        poll_wait: Duration::from_secs(25),
    })
}

pub fn executor(args: ExecutorArgs) -> ExitCode {
    init_logging();
    let rt = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let config = ExecutorConfig {
        master: args.master,
        token: args.token,
        workspace: args.workspace,
        name: args.name,
        concurrency: args.concurrency,
        limits: JobLimits {
            default_timeout: Duration::from_millis(args.default_timeout_ms),
            max_timeout: Duration::from_millis(args.max_timeout_ms),
            max_output: args.max_output_bytes,
            path: args.path,
        },
        grace: Duration::from_millis(args.grace_ms),
        poll_wait: Duration::from_secs(25),
    };
    match rt.block_on(agentos_executor::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
