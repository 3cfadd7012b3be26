//! The net runtime's state: compiled inscriptions, schedules, the limits one net runs under,
//! the crash-loop marker, and what `http` transitions reach the network with. The fire pipeline
//! over it is in the parent module.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use agentos_core::expr::{Expr, ExprError, Runner, Template};
use agentos_core::net::{CommandAction, HttpAction, Inscription, MapAction, OperationAction};
use agentos_core::net_state::{ModelNet, NewToken, TokenRef};
use agentos_core::{CoreError, ErrorKind};

use crate::firing_marker::{CrashLooping, FiringMarker};
use crate::outbound::OutboundPolicy;

/// Why a fire stops short, typed by what follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FireError {
    /// A limit of the net was crossed: the transition stops, and its inputs are parked.
    Stop(String),
    /// The master refuses to fire now (it is short of memory): the inputs are parked, not retried.
    Refused(String),
    /// The action, an expression or the routing failed: the inputs follow the transition's
    /// retry and onError rules.
    Failed(String),
    /// The principals behind the fire lack a flag or a grant the action needs: no attempt can
    /// succeed until an operator changes that, so the inputs go to onError at once (or park).
    Denied(String),
    /// The service answered, and its answer is the failure (a status outside `successStatus`, an
    /// operation's status outside 2xx): as `Failed`, and the error token carries the answer
    /// (`{status, contentType, body}`) as `response`.
    Answered(String, Box<Value>),
}

impl FireError {
    /// The reason, as events, answers and logs carry it.
    pub(crate) fn reason(&self) -> &str {
        match self {
            FireError::Stop(r)
            | FireError::Refused(r)
            | FireError::Failed(r)
            | FireError::Denied(r)
            | FireError::Answered(r, _) => r,
        }
    }

    /// What the service answered, when its answer is the failure.
    pub(crate) fn response(&self) -> Option<&Value> {
        match self {
            FireError::Answered(_, v) => Some(v),
            _ => None,
        }
    }

    /// Whether another attempt could succeed: not when the principals lack a flag or a grant.
    pub(crate) fn retries(&self) -> bool {
        !matches!(self, FireError::Denied(_))
    }

    pub(crate) fn into_reason(self) -> String {
        match self {
            FireError::Stop(r)
            | FireError::Refused(r)
            | FireError::Failed(r)
            | FireError::Denied(r)
            | FireError::Answered(r, _) => r,
        }
    }
}

impl std::fmt::Display for FireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// What an action or its routing reports as failing: its inputs follow retry and onError.
impl From<String> for FireError {
    fn from(reason: String) -> Self {
        FireError::Failed(reason)
    }
}

/// An expression or a template of the inscription gave no value: the fire failed.
impl From<ExprError> for FireError {
    fn from(e: ExprError) -> Self {
        FireError::Failed(e.to_string())
    }
}

impl From<&str> for FireError {
    fn from(reason: &str) -> Self {
        FireError::Failed(reason.to_string())
    }
}

/// Compiled expressions of one inscription, built once per applied version.
pub(crate) struct Compiled {
    pub(crate) inscription: Inscription,
    /// preset -> its filter over every candidate token at once (see [`filter_over_all`]).
    pub(crate) filters: BTreeMap<String, Expr>,
    /// What each filter answered for each token it was asked about: a token's data never
    /// changes, so a filter is asked once per token, not at every commit that looks at the
    /// place. Lives as long as this version of the transition (a new net drops it); catalog
    /// tokens, which change with their entries, are never kept.
    /// preset -> token id -> verdict.
    pub(crate) verdicts: std::sync::Mutex<BTreeMap<String, std::collections::HashMap<String, bool>>>,
    /// The presets whose filter reads nothing but the token (no clock, no environment, no
    /// further input), so that its verdict on a token holds for good.
    pub(crate) pure_filters: std::collections::BTreeSet<String>,
    pub(crate) template: Option<Template>,
    pub(crate) when: Vec<Option<Expr>>,
    pub(crate) http: Option<HttpCompiled>,
    /// An `http` action that names a registered operation instead of a URL.
    pub(crate) operation: Option<OperationCompiled>,
    pub(crate) command: Option<CommandAction>,
}

impl Compiled {
    pub(crate) fn new(t: &Inscription) -> Result<Compiled, ExprError> {
        let action = |e: serde_json::Error| ExprError::Compile(format!("action: {e}"));
        let template = |at: String| move |(p, e): (String, ExprError)| e.within(format_args!("{at}{p}"));
        let mut filters = BTreeMap::new();
        let mut pure_filters = std::collections::BTreeSet::new();
        for (name, p) in &t.presets {
            if let Some(f) = &p.filter {
                filters.insert(name.clone(), Expr::compile(&filter_over_all(f))?);
                if reads_only_its_input(f) {
                    pure_filters.insert(name.clone());
                }
            }
        }
        let when = t.emit.iter().map(|r| r.when.as_deref().map(Expr::compile).transpose()).collect::<Result<_, _>>()?;
        let template_of_map = match t.kind.as_str() {
            "map" => {
                let m: MapAction = serde_json::from_value(t.action.clone()).map_err(action)?;
                Some(Template::compile(&m.template).map_err(template(String::new()))?)
            }
            _ => None,
        };
        let operation = match t.kind.as_str() {
            "http" | "mcp" if OperationAction::named_in(&t.action) => {
                let o: OperationAction = serde_json::from_value(t.action.clone()).map_err(action)?;
                let input = o.input.as_ref().map(Template::compile).transpose().map_err(template("input".into()))?;
                Some(OperationCompiled { action: o, input })
            }
            _ => None,
        };
        let http = match t.kind.as_str() {
            "http" if operation.is_some() => None,
            "http" => {
                let h: HttpAction = serde_json::from_value(t.action.clone()).map_err(action)?;
                let url = Template::compile(&h.url).map_err(template("url".into()))?;
                let mut headers = BTreeMap::new();
                for (k, v) in &h.headers {
                    headers.insert(k.clone(), Template::compile(v).map_err(template(format!("headers/{k}")))?);
                }
                let body = h.body.as_ref().map(Template::compile).transpose().map_err(template("body".into()))?;
                Some(HttpCompiled { action: h, url, headers, body })
            }
            _ => None,
        };
        let command = match t.kind.as_str() {
            "command" if t.action.is_null() => Some(CommandAction::default()),
            "command" => Some(serde_json::from_value(t.action.clone()).map_err(action)?),
            _ => None,
        };
        let template = template_of_map;
        Ok(Compiled {
            inscription: t.clone(),
            filters,
            verdicts: Default::default(),
            pure_filters,
            template,
            when,
            http,
            operation,
            command,
        })
    }
}

/// Whether a jq expression reads nothing but its input: no clock (`now`), no environment
/// (`env`, `$ENV`), no further input (`input`, `inputs`), no debug output. Decided on the text,
/// so a name that merely contains one of these words counts as reading it: a filter wrongly
/// thought impure is only asked again, never answered from a stale verdict.
pub(crate) fn reads_only_its_input(src: &str) -> bool {
    !["now", "env", "ENV", "input", "debug", "stderr", "$__loc__", "halt"].iter().any(|w| src.contains(w))
}

/// A preset filter made into one expression over the array of candidate tokens, answering for
/// each `true`, `false` (jq truthiness of its first output) or `"error: …"`: binding costs one
/// round trip to an expression worker, not one per token. The newline ends a trailing comment.
pub(crate) fn filter_over_all(src: &str) -> String {
    format!("[.[] | try ([({src}\n)][0] | . != null and . != false) catch (\"error: \" + tostring)]")
}

/// What a preset may bind, decided under the state's read lock; filters run after it is released.
pub(crate) enum Candidates {
    /// No filter: bound already.
    Bound(Vec<TokenRef>),
    /// Free tokens for the filter, in place order: each with the filter's verdict when it was
    /// asked before, else with the JSON it reads.
    Filter(Vec<(TokenRef, Candidate)>),
}

pub(crate) enum Candidate {
    Known(bool),
    /// To ask the filter about; `keep`: its verdict may be kept (not a catalog token).
    Ask {
        json: Value,
        keep: bool,
    },
}

/// Verdicts kept per transition version before those of tokens gone are let go.
pub(crate) const VERDICTS_KEPT: usize = 50_000;

/// An http action with its templates compiled.
pub(crate) struct HttpCompiled {
    pub(crate) action: HttpAction,
    pub(crate) url: Template,
    pub(crate) headers: BTreeMap<String, Template>,
    pub(crate) body: Option<Template>,
}

/// An `http` action naming a registered http operation, its input template compiled.
pub(crate) struct OperationCompiled {
    pub(crate) action: OperationAction,
    pub(crate) input: Option<Template>,
}

/// What one net may hold and do, so that a runaway net stops before it exhausts the master.
/// Each is a flag of `agentos serve` (see the README); 0 turns a limit off.
#[derive(Debug, Clone)]
pub struct NetLimits {
    /// Tokens one place may hold (`p-tool-catalog` is exempt: it is the catalog).
    pub max_tokens_per_place: usize,
    /// Tokens one fire may produce.
    pub max_outputs_per_fire: usize,
    /// Bytes of one token's data, as JSON.
    pub max_token_bytes: usize,
    /// Fires of one transition within one second.
    pub max_fires_per_second: u32,
    /// The master's resident memory above which fires fail instead of running.
    pub max_memory_bytes: u64,
    /// The crash-loop marker file; `None`: no crash-loop protection (an engine without a data folder).
    pub firing_marker: Option<std::path::PathBuf>,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            max_tokens_per_place: 100_000,
            max_outputs_per_fire: 1_000,
            max_token_bytes: 1024 * 1024,
            max_fires_per_second: 1_000,
            max_memory_bytes: default_memory_cap(),
            firing_marker: None,
        }
    }
}

/// Three quarters of the memory the master may use: the machine's (`MemTotal`), or less where
/// its cgroup (or one above it) has a lower limit, leaving the rest to the executor, the
/// expression workers and the page cache; 0 (no cap) where neither can be read. Inside a
/// container `MemTotal` is the host's, and a cap above the container's limit would let the
/// kernel's OOM killer, not the master, be the one to refuse.
pub fn default_memory_cap() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limits: Vec<String> = cgroup_limit_files(&own).iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
    memory_cap(meminfo.as_deref(), limits.iter().map(String::as_str))
}

/// The cap from the text of `/proc/meminfo` and of the cgroup limit files (`memory.max` of v2,
/// `memory.limit_in_bytes` of v1; `max` or an unset v1 limit means none).
fn memory_cap<'a>(meminfo: Option<&str>, limits: impl Iterator<Item = &'a str>) -> u64 {
    let total = meminfo.and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    });
    let limit = limits.filter_map(|l| l.trim().parse::<u64>().ok()).min();
    let usable = match (total.map(|k| k.saturating_mul(1024)), limit) {
        (Some(t), Some(l)) => t.min(l),
        (Some(t), None) => t,
        (None, Some(l)) => l,
        (None, None) => 0,
    };
    usable / 4 * 3
}

/// The memory limit files of the cgroup named in `/proc/self/cgroup` and of every cgroup above
/// it (a limit anywhere above applies too), for v2 (`0::/path`) and the v1 memory controller.
fn cgroup_limit_files(proc_self_cgroup: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = std::path::PathBuf::from(root);
        files.push(dir.join(file));
        for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir.push(part);
            files.push(dir.join(file));
        }
    }
    files
}

/// The master's resident memory, from `/proc/self/statm`.
pub(crate) fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The place whose tokens are the catalog's entries: never counted against a limit.
pub const CATALOG_PLACE: &str = "p-tool-catalog";

/// The engine's part that runs nets.
pub(crate) struct NetRuntime {
    pub(crate) compiled: Mutex<HashMap<(String, String), Arc<Compiled>>>,
    /// When each scheduled transition fires next.
    pub(crate) due: Mutex<HashMap<(String, String), tokio::time::Instant>>,
    /// Wakes the fire loop: start and stop, and every committed event that may enable a
    /// transition (the ledger's listener, on the committer's thread).
    pub(crate) wake: Arc<tokio::sync::Notify>,
    pub(crate) next_instance: std::sync::atomic::AtomicU64,
    pub(crate) limits: NetLimits,
    pub(crate) marker: Arc<FiringMarker>,
    /// Transitions found crash-looping at open; the fire loop stops them before it fires anything.
    pub(crate) crash_looping: Mutex<Vec<CrashLooping>>,
    /// Fires per transition in the current one-second window.
    rates: Mutex<HashMap<(String, String), (std::time::Instant, u32)>>,
    /// The last reading of the resident memory: read at most every [`MEMORY_READ_EVERY`].
    memory: Mutex<Option<(std::time::Instant, u64)>>,
    /// Where the jq expressions of inscriptions run.
    pub(crate) expressions: Runner,
    /// Which addresses `http` transitions may reach, and the clients that enforce it.
    pub(crate) outbound: OutboundPolicy,
    pub(crate) http: reqwest::Client,
    /// For requests that carry a secret: redirects are followed within the origin only.
    pub(crate) sealed_http: reqwest::Client,
    fire_loop: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Which models' fires this master runs; `None`: all.
    pub(crate) owners: Option<Arc<dyn agentos_store::ModelLocks>>,
    /// Names this master's tool-net instances, which it alone runs: other masters of a shared
    /// log leave them alone.
    pub(crate) instance_tag: String,
}

/// How stale a memory reading may be: one read per fire would cost a file read per `pass` fire.
const MEMORY_READ_EVERY: Duration = Duration::from_millis(10);

impl NetRuntime {
    pub(crate) fn new(
        limits: &NetLimits,
        outbound: &OutboundPolicy,
        expressions: Runner,
        owners: &crate::engine::Sharing,
    ) -> Result<NetRuntime, crate::outbound::OutboundError> {
        let instance_tag = owners.tag.clone().unwrap_or_else(|| {
            let mut tag = [0u8; 4];
            if getrandom::fill(&mut tag).is_err() {
                tag = std::process::id().to_le_bytes();
            }
            tag.iter().map(|b| format!("{b:02x}")).collect()
        });
        let (marker, looping) = match &limits.firing_marker {
            Some(path) => FiringMarker::open(path),
            None => (FiringMarker::none(), Vec::new()),
        };
        Ok(NetRuntime {
            expressions,
            outbound: outbound.clone(),
            http: outbound.client()?,
            sealed_http: outbound.sealed_client()?,
            fire_loop: Mutex::new(None),
            compiled: Default::default(),
            due: Default::default(),
            wake: Default::default(),
            next_instance: Default::default(),
            limits: limits.clone(),
            marker,
            crash_looping: Mutex::new(looping),
            rates: Default::default(),
            memory: Default::default(),
            owners: owners.locks.clone(),
            instance_tag,
        })
    }

    /// Whether `instance` is a tool-net instance this master (this run or an earlier one) made.
    pub(crate) fn made(&self, instance: &str) -> bool {
        instance.contains(&format!("-{}-", self.instance_tag))
    }

    /// Whether this master runs the fires of `model`: every model on a log of its own; on a
    /// shared log, the models whose lock it holds and its own tool-net instances.
    pub(crate) fn runs(&self, model: &str) -> bool {
        match &self.owners {
            None => true,
            Some(_) if model.starts_with(super::INSTANCE_PREFIX) => self.made(model),
            Some(o) => o.holds(model),
        }
    }

    /// Keeps the fire loop's task, to stop it at shutdown.
    pub(crate) fn set_fire_loop(&self, task: tokio::task::JoinHandle<()>) {
        *self.fire_loop.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    pub(crate) fn stop_fire_loop(&self) {
        if let Some(t) = self.fire_loop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }

    /// A clean stop: no transition was firing when the master died.
    pub(crate) fn clean_stop(&self) {
        self.marker.clear_all();
    }

    /// Forgets what the runtime keeps per transition of `model` (compiled inscriptions, fire
    /// rates, schedules, crash-loop counts): its net was deleted. A tool-net instance per
    /// invocation left one entry of each behind for ever.
    pub(crate) fn forget_model(&self, model: &str) {
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).retain(|(m, _), _| m != model);
        self.rates.lock().unwrap_or_else(|e| e.into_inner()).retain(|(m, _), _| m != model);
        self.due.lock().unwrap_or_else(|e| e.into_inner()).retain(|(m, _), _| m != model);
        self.marker.forget_model(model);
    }

    /// Forgets the fire rates of `model`'s transitions that `keep` does not name (a net applied anew).
    pub(crate) fn forget_rates_except(&self, model: &str, keep: &BTreeSet<&str>) {
        self.rates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(m, t), _| m != model || keep.contains(t.as_str()));
    }

    /// The models the runtime keeps anything for, to check that deleted ones leave nothing.
    #[cfg(test)]
    pub(crate) fn models_held(&self) -> BTreeSet<String> {
        let mut held: BTreeSet<String> = BTreeSet::new();
        held.extend(self.compiled.lock().unwrap_or_else(|e| e.into_inner()).keys().map(|k| k.0.clone()));
        held.extend(self.rates.lock().unwrap_or_else(|e| e.into_inner()).keys().map(|k| k.0.clone()));
        held.extend(self.due.lock().unwrap_or_else(|e| e.into_inner()).keys().map(|k| k.0.clone()));
        held
    }

    /// Refuses token data of more than `--max-token-bytes` (413 `token_too_large`), as a put does.
    pub(crate) fn check_token_bytes(&self, data: &Value) -> Result<(), CoreError> {
        let max = self.limits.max_token_bytes;
        if max == 0 {
            return Ok(());
        }
        let bytes = serde_json::to_vec(data).map_or(usize::MAX, |b| b.len());
        if bytes > max {
            return Err(CoreError::new(
                ErrorKind::TooLarge,
                "token_too_large",
                format!("the token is {bytes} bytes, more than {max} (the master's --max-token-bytes)"),
            ));
        }
        Ok(())
    }

    /// Counts a fire of `key`; the reason to stop it when it exceeds its fires per second.
    pub(crate) fn count_fire(&self, key: &(String, String)) -> Result<(), FireError> {
        let max = self.limits.max_fires_per_second;
        if max == 0 {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let (since, n) = rates.entry(key.clone()).or_insert((now, 0));
        if now.duration_since(*since) >= Duration::from_secs(1) {
            (*since, *n) = (now, 0);
        }
        *n += 1;
        if *n > max {
            return Err(FireError::Stop(format!(
                "stopped: more than {max} fires within one second (the master's --max-fires-per-second); a net that feeds itself without end? Start it again once fixed"
            )));
        }
        Ok(())
    }

    /// Whether a fire of `key` would be within its fires per second now; counts nothing (a
    /// decision that may be made again counts its fires once committed, `Nets::count_chained`).
    pub(crate) fn rate_left(&self, key: &(String, String)) -> bool {
        let max = self.limits.max_fires_per_second;
        if max == 0 {
            return true;
        }
        let rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        rates.get(key).is_none_or(|(since, n)| since.elapsed() >= Duration::from_secs(1) || *n < max)
    }

    /// The reason to refuse a fire when the master's memory is above its cap.
    pub(crate) fn check_memory(&self) -> Result<(), FireError> {
        let cap = self.limits.max_memory_bytes;
        if cap == 0 {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let rss = {
            let mut last = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            match *last {
                Some((at, v)) if now.duration_since(at) < MEMORY_READ_EVERY => v,
                _ => {
                    let v = resident_bytes().unwrap_or(0);
                    *last = Some((now, v));
                    v
                }
            }
        };
        if rss > cap {
            return Err(FireError::Refused(format!(
                "refused: the master uses {} MiB, above its cap of {} MiB (--max-memory-mb); the inputs stay parked",
                rss >> 20,
                cap >> 20
            )));
        }
        Ok(())
    }

    /// The reason to stop a transition whose fire would produce `outputs` (after taking `consumed`)
    /// beyond a limit.
    pub(crate) fn check_outputs(
        &self,
        net: &ModelNet,
        consumed: &[TokenRef],
        outputs: &[NewToken],
    ) -> Result<(), FireError> {
        self.check_outputs_held(|place| net.places.get(place).map_or(0, |p| p.tokens.len()), consumed, outputs)
    }

    /// [`NetRuntime::check_outputs`] with the tokens each place holds told by `held`.
    pub(crate) fn check_outputs_held(
        &self,
        held: impl Fn(&str) -> usize,
        consumed: &[TokenRef],
        outputs: &[NewToken],
    ) -> Result<(), FireError> {
        let l = &self.limits;
        if l.max_outputs_per_fire > 0 && outputs.len() > l.max_outputs_per_fire {
            return Err(FireError::Stop(format!(
                "stopped: one fire produced {} tokens, more than {} (the master's --max-outputs-per-fire)",
                outputs.len(),
                l.max_outputs_per_fire
            )));
        }
        if l.max_token_bytes > 0 {
            for t in outputs {
                let bytes = serde_json::to_vec(&t.data).map_or(usize::MAX, |b| b.len());
                if bytes > l.max_token_bytes {
                    return Err(FireError::Stop(format!(
                        "stopped: a token for {} is {bytes} bytes, more than {} (the master's --max-token-bytes)",
                        t.place, l.max_token_bytes
                    )));
                }
            }
        }
        if l.max_tokens_per_place > 0 {
            let mut added: BTreeMap<&str, i64> = BTreeMap::new();
            for t in outputs {
                *added.entry(t.place.as_str()).or_default() += 1;
            }
            for r in consumed {
                if let Some(n) = added.get_mut(r.place.as_str()) {
                    *n -= 1;
                }
            }
            for (place, n) in added {
                let held = held(place) as i64;
                if place != CATALOG_PLACE && n > 0 && held + n > l.max_tokens_per_place as i64 {
                    return Err(FireError::Stop(format!(
                        "stopped: place {place} would hold {} tokens, more than {} (the master's --max-tokens-per-place)",
                        held + n,
                        l.max_tokens_per_place
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:        8000000 kB\nMemFree:         1000 kB\n";

    fn check(meminfo: Option<&str>, limits: &[&str], expected: u64) {
        assert_eq!(memory_cap(meminfo, limits.iter().copied()), expected, "{meminfo:?} {limits:?}");
    }

    #[test]
    fn the_memory_cap_is_three_quarters_of_the_lower_of_the_machine_and_its_cgroup() {
        let machine = 8_000_000 * 1024;
        check(Some(MEMINFO), &[], machine / 4 * 3);
        // cgroup v2 without a limit, and v1's "unlimited".
        check(Some(MEMINFO), &["max\n", "9223372036854771712\n"], machine / 4 * 3);
        // A container limited to 1 GiB on a larger machine, at its own level or one above.
        check(Some(MEMINFO), &["max\n", "1073741824\n"], 1073741824 / 4 * 3);
        check(Some(MEMINFO), &["536870912\n", "1073741824\n"], 536870912 / 4 * 3);
        // A limit above the machine's memory changes nothing.
        check(Some(MEMINFO), &["99999999999999\n"], machine / 4 * 3);
        check(None, &["1073741824"], 1073741824 / 4 * 3);
        check(None, &["max"], 0);
        check(Some("garbage"), &[], 0);
    }

    #[test]
    fn the_limit_files_are_those_of_the_own_cgroup_and_every_one_above() {
        let files =
            |s: &str| -> Vec<String> { cgroup_limit_files(s).iter().map(|p| p.display().to_string()).collect() };
        assert_eq!(
            files("0::/user.slice/agentos.service\n"),
            [
                "/sys/fs/cgroup/memory.max",
                "/sys/fs/cgroup/user.slice/memory.max",
                "/sys/fs/cgroup/user.slice/agentos.service/memory.max"
            ]
        );
        assert_eq!(
            files("4:memory:/docker/abc\n3:cpuset:/\n0::/\n"),
            [
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory.max"
            ]
        );
        assert_eq!(files("4:cpu,cpuacct:/x\n"), Vec::<String>::new());
    }
}

#[cfg(test)]
mod verdict_tests {
    use super::reads_only_its_input;

    #[test]
    fn only_a_filter_that_reads_its_token_alone_has_its_verdicts_kept() {
        for pure in [".data.n > 5", "(.data.n + 0) > 5 # a comment", ".data.tags | index(\"a\")"] {
            assert!(reads_only_its_input(pure), "{pure}");
        }
        for impure in
            [".data.deadline < now", "env.HOME == \"x\"", "$ENV.X", "input", ".data | debug", "$__loc__.line > 1"]
        {
            assert!(!reads_only_its_input(impure), "{impure}");
        }
    }
}
