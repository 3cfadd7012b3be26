//! Invocations in flight per principal: a principal holds at most `max` at once, each given
//! back when its guard drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agentos_core::{CoreError, ErrorKind};

pub(crate) struct Slots {
    max: usize,
    busy: Mutex<HashMap<String, usize>>,
}

/// Holds one invocation slot; gives it back when dropped.
pub struct SlotGuard {
    slots: Arc<Slots>,
    name: String,
}

impl Slots {
    pub(crate) fn new(max: usize) -> Slots {
        Slots { max, busy: Mutex::new(HashMap::new()) }
    }

    /// Invocations one principal may have in flight.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Takes a slot for `name`, or refuses when it holds `max` already.
    pub(crate) fn take(slots: &Arc<Slots>, name: &str) -> Result<SlotGuard, CoreError> {
        let max = slots.max;
        let mut busy = slots.busy.lock().unwrap_or_else(|e| e.into_inner());
        let n = busy.entry(name.to_string()).or_insert(0);
        if *n >= max {
            return Err(CoreError::new(
                ErrorKind::TooMany,
                "too_many_invocations",
                format!("{name} has {max} invocations in flight, the limit; wait for one to finish"),
            ));
        }
        *n += 1;
        Ok(SlotGuard { slots: slots.clone(), name: name.to_string() })
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut busy = self.slots.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = busy.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                busy.remove(&self.name);
            }
        }
    }
}
