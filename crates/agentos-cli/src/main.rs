//! The `agentos` binary: parses arguments and hands over to the master, an executor, or the API client.

/// `println!` for a command's answer: a standard output that cannot take it (a full disk) ends
/// the command with one line on standard error and exit 1 instead of a panic
/// ([`output::write`]).
macro_rules! outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` likewise.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

#[macro_use]
mod errln;

mod call;
mod client;
mod lean_http;
mod local_link;
mod mcp;
mod output;
mod process;
mod shim;
mod toolkit;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// mimalloc for Rust's own allocations: glibc's allocator took 17–19 % of a busy master's samples
/// (`malloc`, `_int_malloc`, `_int_free`, `malloc_consolidate`), measured in BENCHMARKS.md. C code
/// linked in (SQLite) keeps glibc's. An expression worker keeps glibc's for everything: it caps
/// its address space at 1 GiB, and mimalloc reserves address space ahead and keeps it, so after
/// one large value a worker had too little left to start the expression compiler's thread.
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

struct Allocator;

/// Which allocator this process uses: 0 not known yet, 1 mimalloc, 2 glibc's. Known from the
/// first allocation on, and the same for every thread: it depends only on the environment the
/// process was started with.
static GLIBC: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// mimalloc's `mi_option_arena_reserve` (its `mi_option_e`): how much address space it reserves
/// at a time, in KiB. 1 GiB by default, which a master under `ulimit -v` of 1.3 GiB could not
/// spare: starting the expression compiler's thread (256 MiB of stack) failed, and every net
/// with an expression was refused. 64 MiB at a time leaves an idle master about 190 MB.
const MI_OPTION_ARENA_RESERVE: libc::c_int = 23;
const ARENA_RESERVE_KIB: libc::c_long = 64 * 1024;

unsafe extern "C" {
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
    #[cfg(test)]
    fn mi_option_get_size(option: libc::c_int) -> usize;
}

impl Allocator {
    #[inline]
    fn glibc(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        match GLIBC.load(Relaxed) {
            1 => false,
            2 => true,
            _ => {
                // SAFETY: getenv reads the environment without allocating; nothing in this
                // process changes the environment before its first allocation.
                let worker = unsafe { !libc::getenv(agentos_engine::sandbox::WORKER_ENV_C.as_ptr()).is_null() };
                if !worker {
                    // SAFETY: an option set before mimalloc's first allocation, on the one thread
                    // the process has then.
                    unsafe { mi_option_set(MI_OPTION_ARENA_RESERVE, ARENA_RESERVE_KIB) };
                }
                GLIBC.store(if worker { 2 } else { 1 }, Relaxed);
                worker
            }
        }
    }
}

// SAFETY: every call goes to one of two allocators, the same one for the whole life of the
// process, so each block is freed or grown by the allocator that made it.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { if self.glibc() { std::alloc::System.alloc(layout) } else { mimalloc::MiMalloc.alloc(layout) } }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on.
        unsafe {
            if self.glibc() { std::alloc::System.alloc_zeroed(layout) } else { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's guarantees, passed on; `ptr` came from the same allocator.
        unsafe {
            if self.glibc() { std::alloc::System.dealloc(ptr, layout) } else { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees, passed on; `ptr` came from the same allocator.
        unsafe {
            if self.glibc() {
                std::alloc::System.realloc(ptr, layout, new_size)
            } else {
                mimalloc::MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[derive(Parser)]
#[command(name = "agentos", version, about = "A durable tool platform for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the master on a data folder.
    Serve(ServeArgs),
    /// Start agentos on embedded defaults (./.agentos, 127.0.0.1:7420) with one local executor.
    Up(UpArgs),
    /// Run an executor: poll the master for command jobs and run them.
    Executor(ExecutorArgs),
    /// Write a stopped master's data folder (log, blobs, open jobs; never the secrets key) to
    /// one file, for `agentos import`.
    Export {
        /// The data folder of the master, which must be stopped.
        #[arg(long, default_value = ".agentos")]
        data: PathBuf,
        /// The file to write (default: `<folder name>.agentos-export.jsonl` here). An existing file
        /// is replaced whole, and only once the export is complete.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Put an export into PostgreSQL and an S3 bucket, for masters started with the same
    /// --database and --blobs; every blob is checked on the way in and read back.
    Import {
        /// The file `agentos export` wrote.
        file: PathBuf,
        /// The database (`postgres://USER[:PASSWORD]@HOST:PORT/DB`).
        #[arg(long, env = "AGENTOS_DATABASE", hide_env_values = true, value_name = "URL")]
        database: String,
        /// The bucket (`s3://BUCKET/PREFIX`, with the usual AWS_* variables).
        #[arg(long, env = "AGENTOS_BLOBS", value_name = "URL")]
        blobs: String,
    },
    /// Evaluate jq expressions for a master (started by the master itself).
    #[command(hide = true)]
    ExprWorker,
    /// Manage executor credentials (operator only).
    #[command(subcommand)]
    ExecutorToken(ExecutorTokenCmd),
    /// Show executors: state (polling, busy, idle, gone), last seen, jobs held.
    Executors {
        #[command(flatten)]
        conn: client::Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a script tool once and print its output (exit code: the script's).
    Run(client::RunArgs),
    /// Jobs run with `agentos run --async`: show, wait for, read the output of, cancel.
    #[command(subcommand)]
    Job(Box<client::JobCmd>),
    /// Nets: apply a document, see and put tokens, start, stop, fire, watch.
    #[command(subcommand)]
    Net(Box<client::NetCmd>),
    /// List the tools you can call (all toolkits, or one).
    ListTools {
        #[command(flatten)]
        conn: client::Conn,
        /// One toolkit to list (default: every toolkit you can see).
        toolkit: Option<String>,
        /// The model whose local tools come first, the global ones behind them (default: your
        /// home model).
        #[arg(long, env = "AGENTOS_MODEL")]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Link `agentos-{toolkit}` for every toolkit you can see into DIR; remove stale links.
    InstallShims {
        #[command(flatten)]
        conn: client::Conn,
        /// The folder to link the shims into (put it on PATH).
        #[arg(long)]
        dir: PathBuf,
        /// The model whose local tools come first, the global ones behind them (default: your
        /// home model).
        #[arg(long, env = "AGENTOS_MODEL")]
        model: Option<String>,
    },
    /// Serve the tools you can call over MCP on stdin and stdout, for MCP clients that start a
    /// command. Reaches the master through AGENTOS_URL and AGENTOS_TOKEN, like a shim.
    Mcp,
    /// Print the tool list to put into an agent's system prompt.
    Prompt {
        #[command(flatten)]
        conn: client::Conn,
        /// The model whose local tools come first, the global ones behind them (default: your
        /// home model).
        #[arg(long, env = "AGENTOS_MODEL")]
        model: Option<String>,
        /// markdown or json.
        #[arg(long, default_value = "markdown")]
        format: String,
    },
    /// Agents: create with capability flags, list, revoke (operator only).
    #[command(subcommand)]
    Agent(Box<client::AgentCmd>),
    /// Secrets held by the master, used by name (operator only).
    #[command(subcommand)]
    Secret(Box<client::SecretCmd>),
    /// Read the event log: every change with its principal (needs `l`).
    Audit {
        #[command(flatten)]
        conn: client::Conn,
        /// Only the events of this principal (its name).
        #[arg(long)]
        principal: Option<String>,
        /// Only events after this sequence number.
        #[arg(long)]
        after: Option<u64>,
        /// At most this many events, 1 to 1000.
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
    pub data: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "AGENTOS_LISTEN", default_value = "127.0.0.1:7420", value_parser = listen_address)]
    pub listen: String,
    /// Largest script content accepted, in bytes.
    #[arg(long, env = "AGENTOS_MAX_SCRIPT_BYTES", default_value_t = 1024 * 1024)]
    pub max_script_bytes: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "AGENTOS_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Largest executor result post, in bytes (it carries captured output). At least 16384: a
    /// result whose output is dropped to fit must still fit.
    #[arg(long, env = "AGENTOS_MAX_RESULT_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = result_limit)]
    pub max_result_bytes: usize,
    /// Events between two snapshots of the state.
    #[arg(long, env = "AGENTOS_SNAPSHOT_EVERY", default_value_t = 10_000)]
    pub snapshot_every: u64,
    /// How long a job's lease lasts without a heartbeat, in ms.
    #[arg(long, env = "AGENTOS_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Hand-outs of one job before it fails.
    #[arg(long, env = "AGENTOS_MAX_ATTEMPTS", default_value_t = 3)]
    pub max_attempts: u32,
    /// Command output above this many bytes goes to the blob store.
    #[arg(long, env = "AGENTOS_INLINE_OUTPUT_BYTES", default_value_t = 128 * 1024)]
    pub inline_output_bytes: usize,
    /// Timeout of a command that names none, in ms.
    #[arg(long, env = "AGENTOS_DEFAULT_TIMEOUT_MS", default_value_t = 120_000)]
    pub default_timeout_ms: u64,
    /// Largest timeout a command may ask for, in ms.
    #[arg(long, env = "AGENTOS_MAX_TIMEOUT_MS", default_value_t = 600_000)]
    pub max_timeout_ms: u64,
    /// Invocations one principal may have in flight; more are refused with 429.
    #[arg(long, env = "AGENTOS_MAX_CONCURRENT_INVOCATIONS", default_value_t = 32)]
    pub max_concurrent_invocations: usize,
    /// How long an invocation waits for an executor to appear when none serves the queue,
    /// in ms, before it is answered 504 `no_executor`.
    #[arg(long, env = "AGENTOS_NO_EXECUTOR_GRACE_MS", default_value_t = 10_000)]
    pub no_executor_grace_ms: u64,
    /// How long a job whose caller waits for its result runs before it is written to the job
    /// store (`jobs.db`), in ms; a job that ends sooner is never written. A master that dies
    /// after that runs the job again at its next start; one that dies sooner leaves it (its
    /// caller, told nothing yet, sees a broken connection). 0 stores every job as it is queued.
    #[arg(long, env = "AGENTOS_STORE_AFTER_MS", default_value_t = 100)]
    pub store_after_ms: u64,
    /// How long one jq expression of a net may run, in ms (expressions run in worker processes
    /// limited to 1 GiB).
    #[arg(long, env = "AGENTOS_EXPR_TIMEOUT_MS", default_value_t = 1_000)]
    pub expr_timeout_ms: u64,
    /// An address or CIDR block, on every port or on one (127.0.0.1, 10.0.0.0/8, ::1,
    /// 127.0.0.1:8080, [::1]:8080) that outbound requests may reach although it is refused by
    /// default: loopback, unspecified, link-local, multicast, cloud metadata and this master's
    /// own addresses. The master's own port is opened only by an entry naming it. Repeatable;
    /// comma-separated in the environment.
    #[arg(long = "http-allow", env = "AGENTOS_HTTP_ALLOW", value_delimiter = ',', value_name = "IP[/BITS][:PORT]")]
    pub http_allow: Vec<agentos_engine::outbound::IpRange>,
    /// Refuse private ranges too (10/8, 172.16/12, 192.168/16, fc00::/7), which are allowed by
    /// default so a master can call services on its own network.
    #[arg(long, env = "AGENTOS_HTTP_DENY_PRIVATE")]
    pub http_deny_private: bool,
    /// Past this many tools a caller may call, MCP's tools/list offers agentos_search_tools,
    /// agentos_describe_tool and agentos_call_tool instead of every tool.
    #[arg(long, env = "AGENTOS_MCP_LIST_LIMIT", default_value_t = 64)]
    pub mcp_list_limit: usize,
    /// An MCP session of `/mcp` (or `agentos mcp`) with no request in, and no answer or event
    /// stream open, for this long ends, in ms; a client that keeps its `GET` stream open keeps it.
    #[arg(long, env = "AGENTOS_MCP_SESSION_IDLE_MS", default_value_t = 300_000, value_parser = at_least_one::<u64>)]
    pub mcp_session_idle_ms: u64,
    /// The user MCP servers registered with a command run as: `nobody` (the default when agentos
    /// runs as root), UID:GID, or `current`, which lets them read the data folder and must be
    /// asked for. Without root and without this, command servers are refused.
    #[arg(long, env = "AGENTOS_MCP_RUN_AS")]
    pub mcp_run_as: Option<String>,
    /// An MCP server's connection unused this long is closed (a command server's process
    /// ends), in ms; the next call starts it again.
    #[arg(long, env = "AGENTOS_MCP_IDLE_MS", default_value_t = 300_000)]
    pub mcp_idle_ms: u64,
    /// The one registry container images are imported from (`d`); others are refused.
    #[arg(long, env = "AGENTOS_DOCKER_REGISTRY", default_value = "127.0.0.1:5001")]
    pub docker_registry: String,
    /// The Docker engine's socket.
    #[arg(long, env = "AGENTOS_DOCKER_SOCKET", default_value = "/var/run/docker.sock")]
    pub docker_socket: String,
    /// A tool container unused this long is stopped, in ms; the next call starts it again.
    #[arg(long, env = "AGENTOS_DOCKER_IDLE_MS", default_value_t = 300_000)]
    pub docker_idle_ms: u64,
    /// How long a tool container may take to listen on its port, at import and at a call's
    /// start, in ms.
    #[arg(long, env = "AGENTOS_DOCKER_START_TIMEOUT_MS", default_value_t = 10_000)]
    pub docker_start_timeout_ms: u64,
    /// Tool containers running at once, at most.
    #[arg(long, env = "AGENTOS_MAX_CONTAINERS", default_value_t = 8)]
    pub max_containers: usize,
    /// Connections open at once; more wait until one closes. Never more than half the file
    /// handles the process may open (`ulimit -n`).
    #[arg(long, env = "AGENTOS_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers, in ms; also how long a
    /// kept-alive connection may sit idle between requests. Watch streams and executor long
    /// polls, whose headers arrived, are not cut by it.
    #[arg(long, env = "AGENTOS_HEADER_TIMEOUT_MS", default_value_t = 30_000)]
    pub header_timeout_ms: u64,
    /// The event log on PostgreSQL (`postgres://USER[:PASSWORD]@HOST:PORT/DB`), shared by every
    /// master given the same URL, instead of SQLite in the data folder.
    #[arg(long, env = "AGENTOS_DATABASE", hide_env_values = true, value_name = "URL")]
    pub database: Option<String>,
    /// Blobs in an S3-compatible store (`s3://BUCKET/PREFIX`, with the usual AWS_* variables for
    /// credentials, region and endpoint), instead of the data folder's `blobs`.
    #[arg(long, env = "AGENTOS_BLOBS", value_name = "URL")]
    pub blobs: Option<String>,
    /// The file holding the key that encrypts secrets (default: `<data>/secrets.key`, created
    /// when missing). Masters sharing a database share this file; it is never stored in the
    /// database.
    #[arg(long, env = "AGENTOS_SECRETS_KEY_FILE", value_name = "PATH")]
    pub secrets_key_file: Option<std::path::PathBuf>,
    /// Start past an event of the log that cannot be read, treating it as never written. The
    /// skip is recorded in the log; see the README for what it can leave inconsistent.
    /// Repeatable.
    #[arg(long = "skip-event", value_name = "SEQ")]
    pub skip_events: Vec<u64>,
    /// Tokens one place may hold; a transition that would exceed it stops, a put is refused (0: no limit).
    #[arg(long, env = "AGENTOS_MAX_TOKENS_PER_PLACE", default_value_t = 100_000)]
    pub max_tokens_per_place: usize,
    /// Tokens one fire may produce; a transition that exceeds it stops (0: no limit).
    #[arg(long, env = "AGENTOS_MAX_OUTPUTS_PER_FIRE", default_value_t = 1_000)]
    pub max_outputs_per_fire: usize,
    /// Bytes of one token's data as JSON; a bigger put is refused, a fire producing one stops its transition (0: no limit).
    #[arg(long, env = "AGENTOS_MAX_TOKEN_BYTES", default_value_t = 1024 * 1024)]
    pub max_token_bytes: usize,
    /// Fires of one transition within one second; a transition that exceeds it stops (0: no limit).
    #[arg(long, env = "AGENTOS_MAX_FIRES_PER_SECOND", default_value_t = 1_000)]
    pub max_fires_per_second: u32,
    /// The master's resident memory, in MiB, above which fires fail instead of running
    /// (default: three quarters of the machine's memory; 0: no cap).
    #[arg(long, env = "AGENTOS_MAX_MEMORY_MB")]
    pub max_memory_mb: Option<u64>,
}

#[derive(Args, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Jobs the local executor runs at once (1 to 1024).
    #[arg(long, env = "AGENTOS_EXECUTOR_CONCURRENCY", default_value_t = 2, value_parser = slots())]
    pub executor_concurrency: usize,
    /// The user the local executor runs scripts as: `nobody` (the default, when agentos runs as
    /// root), UID:GID, or `current`, which lets scripts read the data folder and must be asked for.
    #[arg(long)]
    pub run_as: Option<String>,
}

/// A count or duration of which zero would make the option useless (every job timed out at
/// once, or no output kept).
fn at_least_one<T: std::str::FromStr<Err = std::num::ParseIntError> + Default + PartialEq>(
    v: &str,
) -> Result<T, String> {
    match v.parse::<T>() {
        Ok(n) if n == T::default() => Err("use 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The smallest `--max-result-bytes`: a result without its output (the exit status, the error
/// line that says the output was dropped) must still fit, or no result of a large run is ever
/// taken.
const MIN_RESULT_BYTES: usize = 16 * 1024;

fn result_limit(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n < MIN_RESULT_BYTES => {
            Err(format!("use {MIN_RESULT_BYTES} or more: a result whose output is dropped to fit must still fit"))
        }
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `--listen`: HOST:PORT with a port that exists, checked before the data folder is touched
/// (`127.0.0.1:99999` used to create the folder and its LOCK file, then fail to bind).
fn listen_address(v: &str) -> Result<String, String> {
    let usage = "use HOST:PORT, e.g. 127.0.0.1:7420, [::1]:7420 or localhost:7420 (port 0 picks a free one)";
    let (host, port) = v.rsplit_once(':').ok_or_else(|| format!("no port; {usage}"))?;
    port.parse::<u16>().map_err(|_| format!("port {port:?} is not a number from 0 to 65535; {usage}"))?;
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let ok = match bracketed {
        Some(h) => h.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && !host.contains([':', '[', ']', '/', ' ']),
    };
    if !ok {
        return Err(format!("host {host:?} is not an address or a host name; {usage}"));
    }
    Ok(v.to_string())
}

/// `--path`: absolute folders only. A relative entry (or an empty one, which means `.`) would be
/// looked up in each job's own folder, where the job's files are, not where runtimes are.
fn script_path(v: &str) -> Result<String, String> {
    for entry in v.split(':') {
        if !entry.starts_with('/') {
            return Err(format!(
                "{entry:?} is not an absolute folder; use absolute folders separated by ':', e.g. /usr/local/bin:/usr/bin:/bin"
            ));
        }
    }
    Ok(v.to_string())
}

/// Jobs an executor runs at once: at least one, and at most 1024, each slot being a request
/// held open at the master (a mistyped `--concurrency 1000000` took gigabytes before it polled).
fn slots() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024)
}

#[derive(Args, Clone)]
pub struct ExecutorArgs {
    /// The master's URL. Masters sharing one database: several URLs, comma-separated; the
    /// executor talks to the first that answers and moves to the next when it stops answering.
    #[arg(long, env = "AGENTOS_URL", default_value = "http://127.0.0.1:7420")]
    pub master: String,
    /// The executor credential (from `agentos executor-token create NAME`). On the command line it
    /// shows in `ps`: prefer the environment or --token-file.
    #[arg(long, env = "AGENTOS_EXECUTOR_TOKEN", hide_env_values = true, required_unless_present = "token_file")]
    pub token: Option<String>,
    /// A file holding the executor credential.
    #[arg(long, env = "AGENTOS_EXECUTOR_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Folder for the script cache and job folders.
    #[arg(long, env = "AGENTOS_WORKSPACE")]
    pub workspace: PathBuf,
    /// Name shown in `agentos executors` (defaults to the credential's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Jobs run at once (1 to 1024).
    #[arg(long, default_value_t = 1, value_parser = slots())]
    pub concurrency: usize,
    /// Timeout of a job that names none, in ms (at most --max-timeout-ms).
    #[arg(long, default_value_t = 120_000, value_parser = at_least_one::<u64>)]
    pub default_timeout_ms: u64,
    /// Largest timeout a job may ask for, in ms.
    #[arg(long, default_value_t = 600_000, value_parser = at_least_one::<u64>)]
    pub max_timeout_ms: u64,
    /// Bytes of stdout and of stderr kept per job (at least 1).
    #[arg(long, default_value_t = 16 * 1024 * 1024, value_parser = at_least_one::<usize>)]
    pub max_output_bytes: usize,
    /// PATH given to scripts, also where runtimes are found: absolute folders, colon-separated.
    #[arg(long, default_value = "/usr/local/bin:/usr/bin:/bin", value_parser = script_path)]
    pub path: String,
    /// On SIGTERM, how long running jobs may finish before they are killed and handed back, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub grace_ms: u64,
    /// The user scripts run as: `nobody`, `current`, or UID:GID. Default: `nobody` when the
    /// executor runs as root, else `current`.
    #[arg(long)]
    pub run_as: Option<String>,
    /// Uids for jobs that carry a credential (sealed jobs), START-END: each such job runs as a
    /// uid of its own (gid the same number; no /etc/passwd entry needed), and what it leaves
    /// running is killed when it ends. Default 61000-61999 when the executor runs as root.
    /// Executors sharing a machine need ranges of their own. Without root, sealed jobs fail
    /// unless `--run-as current` accepts running them as the executor's user.
    #[arg(long, env = "AGENTOS_SEALED_UIDS")]
    pub sealed_uids: Option<String>,
}

#[derive(Subcommand)]
enum ExecutorTokenCmd {
    /// Create (or rotate) an executor credential; it is printed as the last line.
    Create {
        #[command(flatten)]
        conn: client::Conn,
        /// The executor's name.
        name: String,
    },
}

#[derive(Subcommand)]
enum CatalogCmd {
    /// Search the catalog: a model's local entries first, then the global ones.
    List {
        #[command(flatten)]
        conn: client::Conn,
        /// Binding type: script, http, docker, toolnet, host, mcp.
        #[arg(long = "type")]
        kind: Option<String>,
        /// The model whose local catalog comes first, the global one behind it (default: your
        /// home model).
        #[arg(long)]
        model: Option<String>,
        /// Free text over id, name, description and capabilities.
        #[arg(long, short)]
        q: Option<String>,
        /// Only entries with this capability tag.
        #[arg(long)]
        capability: Option<String>,
        /// Entries per page (50 by default, 1000 at most).
        #[arg(long)]
        limit: Option<usize>,
        /// Entries to skip, for the next page.
        #[arg(long)]
        offset: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry, local first.
    Get {
        #[command(flatten)]
        conn: client::Conn,
        /// The tool id.
        id: String,
        /// The model whose local catalog comes first, the global one behind it (default: your
        /// home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show every definition an entry has had.
    History {
        #[command(flatten)]
        conn: client::Conn,
        /// The tool id.
        id: String,
        /// The model whose local catalog comes first, the global one behind it (default: your
        /// home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register a script tool, pinned by its sha256.
    RegisterScript(client::RegisterScriptArgs),
    /// Register an HTTP service from its OpenAPI document: every operation becomes a tool.
    RegisterHttp(client::RegisterHttpArgs),
    /// Register an MCP server: each tool it lists becomes a tool of toolkit ID.
    RegisterMcp(client::RegisterMcpArgs),
    /// Import a container image of the local registry: validated in a throwaway container, its
    /// OpenAPI document's operations become tools of toolkit ID.
    ImportImage(client::ImportImageArgs),
    /// Remove an entry from a model's catalog.
    Remove {
        #[command(flatten)]
        conn: client::Conn,
        /// The tool id.
        id: String,
        /// The model to remove it from (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Called through a shim, the binary is that toolkit.
    if let Some(toolkit) = toolkit::toolkit_of_argv0() {
        end_quietly_when_the_reader_leaves();
        return ExitCode::from(toolkit::run(toolkit, std::env::args_os().skip(1).collect(), shim::through_reqwest));
    }
    let cli = Cli::parse();
    match cli.command {
        // Before the runtime's threads make heaps of their own.
        Cmd::Serve(_) | Cmd::Up(_) => agentos_engine::limit_allocator_arenas(),
        // Processes that serve keep ignoring SIGPIPE: a peer that hangs up is an error to answer.
        // The MCP relay too: the master closing a request it refused (a body over its limit)
        // while the relay still writes it is one call's error, not the end of the session.
        Cmd::Executor(_) | Cmd::ExprWorker | Cmd::Mcp => {}
        _ => end_quietly_when_the_reader_leaves(),
    }
    match cli.command {
        Cmd::Serve(args) => process::serve(args),
        Cmd::ExprWorker => agentos_engine::sandbox::worker_main(),
        Cmd::Up(args) => process::up(args),
        Cmd::Executor(args) => process::executor(args),
        Cmd::Export { data, out } => process::export(&data, out),
        Cmd::Import { file, database, blobs } => process::import(&file, &database, &blobs),
        Cmd::ExecutorToken(ExecutorTokenCmd::Create { conn, name }) => {
            client::exit(client::create_executor_token(&conn, &name))
        }
        Cmd::Executors { conn, json } => client::exit(client::executors(&conn, json)),
        Cmd::Run(args) => client::run_tool(args),
        Cmd::Job(cmd) => client::job(*cmd),
        Cmd::Catalog(c) => client::exit(run_catalog(*c)),
        Cmd::Net(n) => client::exit(client::net(*n)),
        Cmd::Agent(a) => client::exit(client::agent(*a)),
        Cmd::Secret(s) => client::exit(client::secret(*s)),
        Cmd::Audit { conn, principal, after, limit, json } => {
            client::exit(client::audit(&conn, principal, after, limit, json))
        }
        Cmd::ListTools { conn, toolkit, model, json } => {
            shim::list_tools(&conn, toolkit.as_deref(), model.as_deref(), json)
        }
        Cmd::InstallShims { conn, dir, model } => shim::install_shims(&conn, &dir, model.as_deref()),
        Cmd::Prompt { conn, model, format } => shim::prompt(&conn, model.as_deref(), &format),
        Cmd::Mcp => mcp::run(),
        Cmd::Models { conn, json } => client::exit(client::models(&conn, json)),
    }
}

/// A command whose output goes to a reader that stops reading (`agentos prompt | head`) ends
/// there, as other command-line tools do, instead of failing on its next write.
fn end_quietly_when_the_reader_leaves() {
    // SAFETY: restores the default action of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run_catalog(c: CatalogCmd) -> Result<(), client::ClientError> {
    match c {
        CatalogCmd::List { conn, kind, model, q, capability, limit, offset, json } => {
            client::list(&conn, client::ListArgs { kind, model, q, capability, limit, offset }, json)
        }
        CatalogCmd::Get { conn, id, model, json } => client::get(&conn, &id, model.as_deref(), json),
        CatalogCmd::History { conn, id, model, json } => client::history(&conn, &id, model.as_deref(), json),
        CatalogCmd::RegisterScript(a) => client::register_script(a),
        CatalogCmd::RegisterHttp(a) => client::register_http(a),
        CatalogCmd::RegisterMcp(a) => client::register_mcp(a),
        CatalogCmd::ImportImage(a) => client::import_image(a),
        CatalogCmd::Remove { conn, id, model, json } => client::remove(&conn, &id, model.as_deref(), json),
    }
}

// The lean `agentos-shim`'s rules (`lean/logic.rs`, built into that program by build.rs), here
// for their tests; and the program itself, never compiled here, so that `cargo fmt` keeps it.
#[cfg(test)]
#[path = "../lean/logic.rs"]
mod lean_logic;
#[cfg(test)]
mod lean_logic_tests;
#[cfg(any())]
#[path = "../lean/shim.rs"]
mod lean_shim;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The option set is mimalloc's arena reserve: of its options, only that one and the reserve
    /// at start are sizes, and the other is off.
    #[test]
    fn mimalloc_reserves_address_space_64_mib_at_a_time() {
        // SAFETY: reads an option's value.
        assert_eq!(unsafe { super::mi_option_get_size(super::MI_OPTION_ARENA_RESERVE) }, 64 << 20);
    }

    /// Every argument a person can see in `--help` says what it is for.
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if arg.is_hide_set() || ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                out.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if !sub.is_hide_set() {
                undocumented(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
    }

    /// Regression: `agentos net put --help` listed PLACE, --model, --name and --json with no
    /// word about them.
    #[test]
    fn every_argument_has_help_text() {
        let mut missing = Vec::new();
        undocumented(&Cli::command(), "agentos", &mut missing);
        assert!(missing.is_empty(), "arguments without help text:\n{}", missing.join("\n"));
    }

    /// Regression: `--mcp-session-idle-ms 0` was taken as 1 ms, ending every session between
    /// two requests, and messages then spoke of "1 ms".
    #[test]
    fn an_mcp_session_idle_time_of_zero_is_refused_with_what_to_give() {
        use clap::Parser;
        let Err(e) = Cli::try_parse_from(["agentos", "serve", "--mcp-session-idle-ms", "0"]) else {
            panic!("an idle time of 0 was taken");
        };
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
        assert!(e.to_string().contains("use 1 or more"), "{e}");
        assert!(Cli::try_parse_from(["agentos", "serve", "--mcp-session-idle-ms", "2000"]).is_ok());
    }
}
