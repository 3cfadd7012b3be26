//! The in-memory job queue's hand-out as the queue grows: jobs queued while no executor serves
//! them (executors down, a burst of asynchronous calls, nets fanning out) are handed out one by
//! one when executors come back. Prints the time per hand-out for queues of several depths, and
//! that of counting a caller's open jobs, which each asynchronous call does before it queues,
//! and that of one round of the reaper with every job held on a lease that has not run out.
//!
//! Run with `cargo bench -p agentos-engine --bench queue`.

use std::time::{Duration, Instant};

use agentos_core::job::CommandToken;
use agentos_engine::jobs::{JobConfig, MemoryQueue};

/// Counts timed per depth.
const COUNTS: usize = 1_000;
/// Reaper rounds timed per depth.
const REAPS: usize = 100;

fn main() {
    println!("job queue hand-out, one thread, release build; µs per hand-out (median of 5 drains)");
    println!("{:>8} {:>12} {:>12} {:>14} {:>10}", "queued", "hand-out µs", "drain ms", "open-count µs", "reap µs");
    for depth in [100usize, 1_000, 10_000, 30_000] {
        let mut per = Vec::new();
        let mut drains = Vec::new();
        let mut counts = Vec::new();
        let mut reaps = Vec::new();
        for _ in 0..5 {
            let q = MemoryQueue::new(JobConfig {
                lease: Duration::from_secs(30),
                max_attempts: 3,
                gone_after: Duration::from_secs(60),
            });
            let token = CommandToken {
                executor: "script".into(),
                command: "invoke".into(),
                args: serde_json::json!({"toolId": "t"}),
            };
            // Direct jobs of 100 callers, as asynchronous calls leave them.
            let waiters: Vec<_> = (0..depth)
                .map(|i| q.enqueue_direct(q.new_id(), "default".into(), token.clone(), format!("caller-{}", i % 100)))
                .collect();
            let start = Instant::now();
            for i in 0..COUNTS {
                std::hint::black_box(q.open_jobs_of(&format!("caller-{}", i % 100)));
            }
            counts.push(start.elapsed().as_secs_f64() * 1e6 / COUNTS as f64);
            let start = Instant::now();
            let mut taken = 0;
            while q.take_now("e1", None).is_some() {
                taken += 1;
            }
            let drain = start.elapsed();
            assert_eq!(taken, depth, "every queued job is handed out once");
            // Every job is held now, and no lease has run out: a round finds nothing to do.
            let start = Instant::now();
            for _ in 0..REAPS {
                assert!(std::hint::black_box(q.reap()).is_empty());
            }
            reaps.push(start.elapsed().as_secs_f64() * 1e6 / REAPS as f64);
            drop(waiters);
            per.push(drain.as_secs_f64() * 1e6 / depth as f64);
            drains.push(drain.as_secs_f64() * 1e3);
        }
        per.sort_by(f64::total_cmp);
        drains.sort_by(f64::total_cmp);
        counts.sort_by(f64::total_cmp);
        reaps.sort_by(f64::total_cmp);
        println!("{depth:>8} {:>12.2} {:>12.1} {:>14.2} {:>10.2}", per[2], drains[2], counts[2], reaps[2]);
    }
}
