//! The `agentos` binary: parses arguments and hands over to the master or the API client.

mod client;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agentos",
    version,
    about = "A durable tool platform for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the master on a data folder.
    Serve(ServeArgs),
    /// Start agentos on embedded defaults (./.agentos, 127.0.0.1:7420) and show how to use it.
    Up(ServeArgs),
    /// Read and write the tool catalog.
    #[command(subcommand)]
    Catalog(Box<CatalogCmd>),
    /// List models and their places.
    Models {
        #[command(flatten)]
        conn: client::Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Clone)]
pub struct ServeArgs {
    /// Data folder: event log, blobs, operator token.
    #[arg(long, env = "AGENTOS_DATA", default_value = "./.agentos")]
    data: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "AGENTOS_LISTEN", default_value = "127.0.0.1:7420")]
    listen: String,
    /// Largest script content accepted, in bytes.
    #[arg(long, env = "AGENTOS_MAX_SCRIPT_BYTES", default_value_t = 1024 * 1024)]
    max_script_bytes: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "AGENTOS_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Events between two snapshots of the state.
    #[arg(long, env = "AGENTOS_SNAPSHOT_EVERY", default_value_t = 10_000)]
    snapshot_every: u64,
}

#[derive(Subcommand)]
enum CatalogCmd {
    /// Search the catalog (local first when --model is given).
    List {
        #[command(flatten)]
        conn: client::Conn,
        /// Binding type: script, http, docker, toolnet, host, mcp.
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long)]
        model: Option<String>,
        /// Free text over id, name, description and capabilities.
        #[arg(long, short)]
        q: Option<String>,
        #[arg(long)]
        capability: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        offset: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Show one entry (local first when --model is given).
    Get {
        #[command(flatten)]
        conn: client::Conn,
        id: String,
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show every definition an entry has had.
    History {
        #[command(flatten)]
        conn: client::Conn,
        id: String,
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Register a script tool, pinned by its sha256.
    RegisterScript(client::RegisterScriptArgs),
    /// Remove an entry from a model's catalog.
    Remove {
        #[command(flatten)]
        conn: client::Conn,
        id: String,
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve(args) => serve(args, false),
        Cmd::Up(args) => serve(args, true),
        Cmd::Catalog(c) => client::exit(run_catalog(*c)),
        Cmd::Models { conn, json } => client::exit(client::models(&conn, json)),
    }
}

fn run_catalog(c: CatalogCmd) -> Result<(), client::ClientError> {
    match c {
        CatalogCmd::List {
            conn,
            kind,
            model,
            q,
            capability,
            limit,
            offset,
            json,
        } => client::list(
            &conn,
            client::ListArgs {
                kind,
                model,
                q,
                capability,
                limit,
                offset,
            },
            json,
        ),
        CatalogCmd::Get {
            conn,
            id,
            model,
            json,
        } => client::get(&conn, &id, model.as_deref(), json),
        CatalogCmd::History {
            conn,
            id,
            model,
            json,
        } => client::history(&conn, &id, model.as_deref(), json),
        CatalogCmd::RegisterScript(a) => client::register_script(a),
        CatalogCmd::Remove {
            conn,
            id,
            model,
            json,
        } => client::remove(&conn, &id, model.as_deref(), json),
    }
}

fn serve(args: ServeArgs, welcome: bool) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTOS_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let config = agentos_server::ServeConfig {
        data_dir: args.data.clone(),
        listen: args.listen.clone(),
        max_script_bytes: args.max_script_bytes,
        max_body_bytes: args.max_body_bytes,
        snapshot_every: args.snapshot_every,
    };
    let result = runtime.block_on(agentos_server::run(
        config,
        |ready| output::ready(ready, welcome),
        shutdown_signal(),
    ));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
