//! Events as the log records them, decoded for the state; and the clock they are stamped with.

use agentos_core::event::{Event, EventBody};

use crate::EngineError;

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Everything the engine needs from a recorded event to fold it.
pub(crate) fn to_event(rec: agentos_store::RecordedEvent) -> Result<Event, EngineError> {
    let body = EventBody::from_parts(&rec.event.kind, &rec.event.payload)?;
    Ok(with_body(rec, body))
}

/// A recorded event with its body already decoded.
pub(crate) fn with_body(rec: agentos_store::RecordedEvent, body: EventBody) -> Event {
    Event {
        seq: rec.seq,
        model: rec.event.model,
        body,
        principal: rec.event.principal,
        time: rec.event.time,
        schema: rec.event.schema,
    }
}
