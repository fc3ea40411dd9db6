//! The violation log as the pipeline sees it: one rejection (`Event`) and where it goes
//! (`EventSink`). Admission pushes events; the PostgreSQL writer (`db::events::EventQueue`)
//! is the sink a gateway with a database runs. Pure: it imports nothing above `limiter`.

use std::net::IpAddr;
use std::sync::Arc;

use crate::limiter::Window;

/// One rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Tenant of the caller, if known.
    pub tenant_id: Option<Arc<str>>,
    /// Key id of the caller, if known.
    pub api_key_id: Option<Arc<str>>,
    /// Client address.
    pub ip: IpAddr,
    /// Scope that rejected (`ip`, `key`, `tenant`, `global`, `auth`).
    pub scope: &'static str,
    /// The limited identity, `<scope>:<id>` (e.g. `key:key_demo`).
    pub limit_key: String,
    /// The limit.
    pub limit_value: u64,
    /// The count the request would have reached.
    pub count: u64,
    /// The window.
    pub window: Window,
    /// A span in seconds that replaces `window` (an automatic ban's `within_secs`).
    pub span_secs: Option<u64>,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// Where the pipeline sends its violation events. Called on the request path: it must
/// never block or wait on I/O (queue the event, drop it when full).
pub trait EventSink: Send + Sync + 'static {
    /// Takes one event.
    fn push(&self, event: Event);
}
