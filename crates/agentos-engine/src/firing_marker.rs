//! Crash-loop protection for nets: a small file beside the log that names the transitions whose
//! fires are under way, so that a master which died twice in a row while one of them was firing
//! starts with that transition stopped instead of dying a third time.
//!
//! The file lives outside the event log on purpose. Recording "fire begins" in the log would cost
//! a commit (an fsync) per `pass` or `map` fire, halving their throughput; the marker only has to
//! survive the death of the process, not of the machine, so a plain write that reaches the page
//! cache is enough, and it is written only when the set of firing transitions changes. A
//! transition that keeps firing writes the file once; when it goes idle the file is rewritten
//! [`CLEAR_DELAY`] later, so a busy net costs no write per fire.
//!
//! "In a row" means with no fire of that transition ending between the two deaths: the first fire
//! of a transition that ends in a run forgets its count. A master killed by hand while its nets
//! work therefore never stops them, since their fires end between kills; a fire that kills the
//! master every time it runs never ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long an idle transition stays named in the file: what makes a busy net cost no write.
pub(crate) const CLEAR_DELAY: Duration = Duration::from_millis(200);

/// Deaths in a row during a transition's fires after which it starts stopped.
pub(crate) const DEATHS_TO_STOP: u32 = 2;

/// (model, transition).
pub(crate) type Key = (String, String);

/// What the file holds.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// Transitions with a fire under way (or ended less than [`CLEAR_DELAY`] ago).
    firing: BTreeSet<Key>,
    /// Deaths in a row while each transition was firing, carried from earlier runs.
    #[serde(default)]
    deaths: BTreeMap<String, (Key, u32)>,
}

#[derive(Default)]
struct Marks {
    /// Fires under way per transition.
    active: HashMap<Key, usize>,
    /// What the file says now.
    written: Record,
    /// A rewrite that clears idle transitions is scheduled.
    clear_scheduled: bool,
}

/// The marker of one master. Without a path (an engine without a data folder) it marks nothing.
pub(crate) struct FiringMarker {
    path: Option<PathBuf>,
    marks: Mutex<Marks>,
}

/// A transition that was firing at the last [`DEATHS_TO_STOP`] deaths of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CrashLooping {
    pub model: String,
    pub transition: String,
    pub deaths: u32,
}

fn death_key(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

impl FiringMarker {
    /// A marker that marks nothing.
    pub(crate) fn none() -> Arc<FiringMarker> {
        Arc::new(FiringMarker { path: None, marks: Mutex::new(Marks::default()) })
    }

    /// Reads what the previous run left, counts a death for every transition it names as firing,
    /// and answers those that reached [`DEATHS_TO_STOP`]. A missing or unreadable file is a clean
    /// previous stop.
    pub(crate) fn open(path: &Path) -> (Arc<FiringMarker>, Vec<CrashLooping>) {
        let before: Record = std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let mut deaths = BTreeMap::new();
        let mut looping = Vec::new();
        for k in &before.firing {
            let n = before.deaths.get(&death_key(k)).map_or(0, |(_, n)| *n) + 1;
            if n >= DEATHS_TO_STOP {
                looping.push(CrashLooping { model: k.0.clone(), transition: k.1.clone(), deaths: n });
            } else {
                deaths.insert(death_key(k), (k.clone(), n));
            }
        }
        let marker = Arc::new(FiringMarker { path: Some(path.to_path_buf()), marks: Mutex::new(Marks::default()) });
        {
            let mut m = marker.lock();
            m.written.deaths = deaths;
            marker.write(&m.written);
        }
        (marker, looping)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, record: &Record) {
        let Some(path) = &self.path else { return };
        // Written whole and renamed into place: a death mid-write leaves the old file or the new.
        let tmp = path.with_extension("tmp");
        let result = serde_json::to_vec(record).map_err(std::io::Error::other).and_then(|bytes| {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            std::fs::rename(&tmp, path)
        });
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "writing the firing marker failed");
        }
    }

    /// Marks a fire of `key` as under way until the guard is dropped. Writes the file before
    /// answering when the transition is not named in it yet.
    pub(crate) fn enter(self: &Arc<Self>, key: Key) -> FiringGuard {
        if self.path.is_some() {
            let mut m = self.lock();
            *m.active.entry(key.clone()).or_default() += 1;
            if m.written.firing.insert(key.clone()) {
                self.write(&m.written);
            }
        }
        FiringGuard { marker: self.clone(), key }
    }

    fn leave(self: &Arc<Self>, key: &Key) {
        if self.path.is_none() {
            return;
        }
        let mut m = self.lock();
        if let Some(n) = m.active.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                m.active.remove(key);
            }
        }
        // A fire ended: the master survived it, so its deaths were not in a row.
        if m.written.deaths.remove(&death_key(key)).is_some() {
            self.write(&m.written);
        }
        if !m.active.contains_key(key) && !m.clear_scheduled {
            m.clear_scheduled = true;
            let marker = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        tokio::time::sleep(CLEAR_DELAY).await;
                        marker.clear_idle();
                    });
                }
                Err(_) => {
                    drop(m);
                    self.clear_idle();
                }
            }
        }
    }

    /// Rewrites the file without the transitions that stopped firing.
    pub(crate) fn clear_idle(&self) {
        let mut m = self.lock();
        m.clear_scheduled = false;
        let active: BTreeSet<Key> = m.active.keys().cloned().collect();
        if m.written.firing != active {
            m.written.firing = active;
            self.write(&m.written);
        }
    }

    /// Forgets the deaths counted for `model`'s transitions: its net was deleted (a tool-net
    /// instance), so nothing of it will fire again.
    pub(crate) fn forget_model(&self, model: &str) {
        let mut m = self.lock();
        let before = m.written.deaths.len();
        m.written.deaths.retain(|_, (k, _)| k.0 != model);
        if m.written.deaths.len() != before {
            self.write(&m.written);
        }
    }

    /// A clean stop: nothing was firing, and no death is carried.
    pub(crate) fn clear_all(&self) {
        let mut m = self.lock();
        m.written = Record::default();
        self.write(&m.written);
    }
}

/// A fire under way; dropping it ends the mark.
pub(crate) struct FiringGuard {
    marker: Arc<FiringMarker>,
    key: Key,
}

impl Drop for FiringGuard {
    fn drop(&mut self) {
        self.marker.leave(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str) -> Key {
        ("m".into(), t.into())
    }

    /// A master that dies while `t` fires: the guard is leaked, as a killed process leaks it.
    fn die_while_firing(path: &Path, t: &str) -> Vec<CrashLooping> {
        let (marker, looping) = FiringMarker::open(path);
        std::mem::forget(marker.enter(key(t)));
        looping
    }

    #[test]
    fn a_transition_firing_at_two_deaths_in_a_row_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        assert!(die_while_firing(&path, "t").is_empty());
        assert!(die_while_firing(&path, "t").is_empty(), "one death is not a loop");
        let (_, looping) = FiringMarker::open(&path);
        assert_eq!(looping, vec![CrashLooping { model: "m".into(), transition: "t".into(), deaths: 2 }]);
        // Named once: the count starts again.
        let (_, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty());
    }

    #[test]
    fn a_fire_that_ends_between_two_deaths_forgets_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        die_while_firing(&path, "t");
        let (marker, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty());
        drop(marker.enter(key("t")));
        std::mem::forget(marker.enter(key("t")));
        let (_, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty(), "the deaths were not in a row: {looping:?}");
    }

    #[test]
    fn a_clean_stop_and_an_idle_transition_count_no_death() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        die_while_firing(&path, "t");
        let (marker, _) = FiringMarker::open(&path);
        marker.clear_all();
        drop(marker);
        die_while_firing(&path, "t");
        let (marker, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty(), "a clean stop came between: {looping:?}");
        // Outside a runtime an idle transition is cleared at once.
        drop(marker.enter(key("u")));
        let (_, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty());
        let (_, looping) = FiringMarker::open(&path);
        assert!(looping.is_empty());
    }

    #[test]
    fn only_a_change_of_the_firing_set_writes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        let (marker, _) = FiringMarker::open(&path);
        let a = marker.enter(key("t"));
        std::fs::remove_file(&path).unwrap();
        let b = marker.enter(key("t"));
        assert!(!path.exists(), "a second fire of a named transition wrote the file");
        drop((a, b));
    }
}
