//! The client side's timeouts on a Pingora session: the request body has
//! `body_timeout_secs` in all from the end of its headers (each read gets what is left of
//! that budget), and a client that reads nothing for `idle_timeout_secs` is dropped.

use std::time::Duration;

use pingora::proxy::Session;
use tokio::time::Instant;

use super::RequestCtx;
use crate::admission::Core;

/// Sets the request's timeouts once its headers are read.
pub(super) fn arm(session: &mut Session, ctx: &mut RequestCtx, core: &Core) {
    let (body_timeout, idle_timeout) = {
        let rt = core.runtime();
        (rt.config.server.body_timeout, rt.config.server.idle_timeout)
    };
    ctx.body_deadline = Some(Instant::now() + body_timeout);
    // Each body read may take what is left of the budget (HTTP/1; see `body_budget`).
    session.set_read_timeout(Some(body_timeout));
    // A body left unread after the response is drained for at most as long (an HTTP/2
    // stream the client never ends would otherwise keep its connection busy forever),
    // and a client that reads nothing of its response for `idle_timeout_secs` (a zero
    // flow-control window, a full TCP window) is dropped.
    session.set_total_drain_timeout(Some(body_timeout));
    session.set_write_timeout(Some(idle_timeout));
}

/// After a piece of the request body (`end_of_stream`: its end, also for a request without
/// a body): the next read's budget, or the mark where the adaptive latency starts. A retry
/// on another upstream sends the body again and moves the mark.
pub(super) fn body_read(
    session: &mut Session,
    ctx: &mut RequestCtx,
    end_of_stream: bool,
    core: &Core,
) {
    if session.was_upgraded() {
        // A tunnel's bytes are no request body: only the idle timeout applies.
        if ctx.body_deadline.take().is_some() {
            let idle = core.runtime().config.server.idle_timeout;
            session.set_read_timeout(Some(idle));
        }
    } else if end_of_stream {
        ctx.upstream_sent = Some(Instant::now());
    } else if let Some(deadline) = ctx.body_deadline {
        // The next body read gets what is left of `body_timeout_secs`.
        session.set_read_timeout(Some(body_budget(deadline)));
    }
}

/// What is left of a request's body budget; at least a millisecond, so that a read
/// past the deadline fails at once rather than waiting without a timeout.
fn body_budget(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}
