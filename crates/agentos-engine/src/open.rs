//! Starting and stopping a master's engine: the ledger first, then the subsystems over it, then
//! the loops that run on their own (the fire loop, the lease reaper).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentos_core::CoreError;
use agentos_store::{BlobStore, EventLog, VerifyBlobStore};

use crate::engine::{CatalogState, DispatchState, Inner, PrincipalState};
use crate::jobs::JobQueue;
use crate::ledger::Ledger;
use crate::{Engine, EngineConfig, EngineError};

impl Engine {
    /// Opens the engine: the ledger folds the newest usable snapshot and every event after
    /// it; then the subsystems start over it.
    pub async fn open(
        config: EngineConfig,
        log: Arc<dyn EventLog>,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<Engine, EngineError> {
        let ledger = Ledger::open(log, &config.skip_events, config.snapshot_every).await?;
        let nets = crate::nets::runtime::NetRuntime::new(
            &config.nets,
            &config.outbound,
            config.expressions.clone(),
            &config.sharing,
        )
        .map_err(|e| CoreError::internal(e.to_string()))?;
        let engine = Engine {
            inner: Arc::new(Inner {
                ledger,
                catalog: CatalogState {
                    blobs: VerifyBlobStore::new(blobs),
                    limits: config.limits,
                    prepared: Default::default(),
                },
                dispatch: DispatchState {
                    jobs: Arc::new(match &config.sharing.jobs {
                        None => JobQueue::memory(config.jobs),
                        Some(rows) => {
                            JobQueue::shared(rows.clone(), nets.instance_tag.clone(), config.secret_key, config.jobs)
                        }
                    }),
                    config: config.dispatch,
                    durable: Default::default(),
                    reaper: Mutex::new(None),
                    stopping: Default::default(),
                    net_steps: Default::default(),
                },
                nets,
                principals: PrincipalState {
                    secret_key: config.secret_key,
                    slots: Arc::new(crate::slots::Slots::new(config.max_concurrent_invocations)),
                    redactor: Mutex::new(None),
                },
                host: Default::default(),
                mcp: crate::bindings::mcp::McpServers::new(config.mcp),
                docker: crate::bindings::docker::Containers::new(config.docker),
                recent: Default::default(),
            }),
        };
        // From here on every committed event is heard on the committer's thread, before its
        // command is answered: a job's result is listed by the time its caller has it, a caller
        // waiting on this master for a job of a shared queue hears its result whichever master
        // recorded it, and the fire loop wakes; no task follows the broadcast for any of them.
        let (recent, wake) = (engine.inner.recent.clone(), engine.inner.nets.wake.clone());
        let waiters = engine.inner.dispatch.jobs.result_waiters();
        let listen: crate::committer::Listener = Box::new(move |ev| {
            recent.note(ev);
            if let (Some(waiters), agentos_core::event::EventBody::JobFinished { job_id, result, .. }) =
                (&waiters, &ev.body)
            {
                waiters.resolve(job_id, result);
            }
            if crate::nets::may_enable_a_fire(ev) {
                wake.notify_one();
            }
        });
        if engine.inner.ledger.listener.set(listen).is_err() {
            return Err(CoreError::internal("the ledger's listener was set twice").into());
        }
        // Containers an earlier run left (killed mid-import, say) go, off the start's path.
        {
            let engine = engine.clone();
            tokio::spawn(async move { engine.inner.docker.sweep().await });
        }
        engine.inner.mcp.set_engine(Arc::downgrade(&engine.inner));
        engine.nets().sweep_instances().await;
        engine.nets().stop_crash_looping().await;
        let weak_nets = Arc::downgrade(&engine.inner);
        let fire_loop = tokio::spawn(crate::nets::net_loop(weak_nets));
        engine.inner.nets.set_fire_loop(fire_loop);
        // The reaper holds a weak handle so that dropping every Engine ends it.
        let weak = Arc::downgrade(&engine.inner);
        let tick =
            (engine.inner.dispatch.jobs.config().lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let reaper = tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                Engine { inner }.dispatch().reap_jobs().await;
            }
        });
        *engine.inner.dispatch.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(reaper);
        crate::recent::fill(&engine).await;
        Ok(engine)
    }

    /// Whether the master was asked to stop ([`Engine::begin_stop`]).
    pub fn is_stopping(&self) -> bool {
        self.inner.dispatch.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The master was asked to stop: its connections close from now on, and the calls they
    /// carried are not their callers' to cancel (their stored jobs run again after a restart).
    pub fn begin_stop(&self) {
        self.inner.dispatch.stopping.store(true, std::sync::atomic::Ordering::Release);
        // An executor's long poll is answered "no job" now rather than held to the stop's
        // deadline: the executor moves on (to another master, or waits for this one to return)
        // at once, and the stop is not kept waiting on idle polls.
        self.inner.dispatch.jobs.end_polls();
    }

    /// Stops the loops, lets the commands already queued commit, and writes a final snapshot.
    pub async fn shutdown(&self) {
        if let Some(r) = self.inner.dispatch.reaper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            r.abort();
        }
        self.inner.nets.stop_fire_loop();
        self.inner.nets.clean_stop();
        self.inner.mcp.stop_all();
        self.inner.docker.stop_all().await;
        self.inner.ledger.close().await;
    }
}
