//! One peer region as the sync loop writes to it: its store (a single node, or a Redis
//! Cluster found from the first reply that names one), the writes in flight, and one
//! write (batched merges; on a Cluster one merge per hash tag and the index apart).

use std::sync::atomic::AtomicUsize;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;

use super::{ranges, BATCH};
use crate::regions::store as wire;
use crate::regions::{LiveWindow, SyncWrite};
use crate::store::redis::{RedisStore, Target};
use crate::store::StoreError;

/// One peer region: its index, name and store.
pub(super) struct PeerLink {
    pub(super) index: usize,
    pub(super) name: String,
    url: String,
    /// A single node (a peer's URL names one node).
    store: RedisStore,
    /// The peer's Redis Cluster, seeded with the URL, once a reply showed it is one.
    cluster: OnceLock<RedisStore>,
    /// Writes in flight (see `RegionSync::max_in_flight`).
    pub(super) in_flight: AtomicUsize,
    /// The connection's generation: bumped when a write on it fails, which replaces it
    /// and gives up the writes still waiting on it (see `PeerLink::send`).
    generation: watch::Sender<u64>,
}

/// What a write is: every live window's state for this peer, from region `from` of `r`.
pub(super) struct Write {
    pub(super) writes: Vec<(LiveWindow, SyncWrite)>,
    pub(super) r: usize,
    pub(super) from: usize,
    pub(super) now_ms: u64,
}

impl PeerLink {
    /// The peer `name` (region `index`) at `url`; every call within `deadline`.
    pub(super) fn new(
        index: usize,
        name: &str,
        url: &str,
        deadline: Duration,
        prefix: &str,
    ) -> Self {
        Self {
            index,
            name: name.to_string(),
            url: url.to_string(),
            store: RedisStore::peer(Target::Single(url.to_string()), deadline, prefix),
            cluster: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            generation: watch::Sender::new(0),
        }
    }

    fn store(&self) -> &RedisStore {
        self.cluster.get().unwrap_or(&self.store)
    }

    /// Sends `write`; whether the peer answered it (any reply renews the link: the peer
    /// is reachable, whether it merged; a window over there is refused, not lost). The
    /// first write on a connection to fail replaces the connection, and the writes still
    /// waiting on it are given up: a newer write follows on the new connection, and once
    /// the last of them lets go the old one closes with a reset, which drops what a
    /// partition holds of it (`RedisStore::tcp_settings`). So at a heal a peer runs the
    /// writes of one connection (`partition_secs / sync_ms` at most), not every write
    /// sent into the cut, and the fresh one does not wait behind them.
    pub(super) async fn send(&self, write: Write) -> bool {
        let mut replaced = self.generation.subscribe();
        let generation = *replaced.borrow_and_update();
        let sent = async {
            match self.cluster.get() {
                Some(cluster) => self.send_cluster(cluster, &write).await,
                None => self.send_single(&write).await,
            }
        };
        let result = tokio::select! {
            // A reply that came with the replacement still counts.
            biased;
            r = sent => r,
            _ = replaced.changed() => return false,
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(peer = %self.name, error = %e, "regions: sync write failed");
                if self.cluster.get().is_none() && names_a_cluster(&e) {
                    tracing::info!(peer = %self.name, "regions: the peer is a Redis Cluster");
                    let deadline = self.store.timeout();
                    let cluster = RedisStore::peer(
                        Target::Cluster(vec![self.url.clone()]),
                        deadline,
                        self.store.prefix(),
                    );
                    let _ = self.cluster.set(cluster);
                } else {
                    self.generation.send_if_modified(|g| {
                        // Once per connection: the writes sent after it on the same one fail
                        // too. Dropped under the watch's lock, so a write that reads the new
                        // generation cannot still find the old connection.
                        let first = *g == generation;
                        if first {
                            *g += 1;
                            self.store().reconnect();
                        }
                        first
                    });
                }
                false
            }
        }
    }

    /// Batches of `BATCH` windows, the index in each call. With no live window an empty
    /// batch still goes: it keeps the link alive (and the partition metric true), so
    /// grants go out with the first window after an idle spell.
    async fn send_single(&self, write: &Write) -> Result<(), StoreError> {
        let store = &self.store;
        let index = wire::index_key(store.prefix());
        let batches: Vec<&[(LiveWindow, SyncWrite)]> = match write.writes.is_empty() {
            true => vec![&[]],
            false => write.writes.chunks(BATCH).collect(),
        };
        for chunk in batches {
            let batch: Vec<(&LiveWindow, SyncWrite)> = chunk.iter().map(|(w, s)| (w, *s)).collect();
            let cmd = wire::merge_cmd(
                store.regions_sha(),
                &store.script_now(),
                (write.r, self.index, write.from),
                &index,
                &batch,
            );
            parsed(store.regions_call(&cmd).await?)?;
        }
        Ok(())
    }

    /// One merge per hash tag (concurrently), then the index (whose own call also keeps
    /// an idle link alive).
    async fn send_cluster(&self, store: &RedisStore, write: &Write) -> Result<(), StoreError> {
        let mut writes: Vec<&(LiveWindow, SyncWrite)> = write.writes.iter().collect();
        writes.sort_by(|a, b| wire::hash_tag(&a.0.key).cmp(wire::hash_tag(&b.0.key)));
        let parts = ranges(writes.len(), true, |i| &writes[i].0.key);
        let calls = parts.iter().map(|range| {
            let batch: Vec<(&LiveWindow, SyncWrite)> =
                writes[range.clone()].iter().map(|(w, s)| (w, *s)).collect();
            let cmd = wire::merge_keys_cmd(
                store.regions_sha(),
                &store.script_now(),
                (write.r, self.index, write.from),
                &batch,
            );
            async move { parsed(store.regions_call(&cmd).await?) }
        });
        for r in join_all(calls).await {
            r?;
        }
        let windows: Vec<&LiveWindow> = writes.iter().map(|(w, _)| w).collect();
        let index = wire::index_key(store.prefix());
        store
            .regions_pipe(&wire::index_cmd(&index, write.now_ms, &windows))
            .await
    }
}

/// A reply of the merge script: its integers, or an error when it is not one.
fn parsed(raw: Vec<u8>) -> Result<(), StoreError> {
    match wire::ints(&raw) {
        Some(_) => Ok(()),
        None => Err(StoreError::Unavailable(
            "a merge reply was not integers".into(),
        )),
    }
}

/// Whether a failed call's error is a Redis Cluster's (a key on another node, or keys of
/// several slots in one call).
fn names_a_cluster(e: &StoreError) -> bool {
    let s = e.to_string().to_ascii_lowercase();
    ["moved", "crossslot", "clusterdown"]
        .iter()
        .any(|m| s.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_errors_are_told_from_others() {
        for (msg, cluster) in [
            (
                "An error was signalled by the server - Moved: 3999 127.0.0.1:6381",
                true,
            ),
            (
                "CROSSSLOT Keys in request don't hash to the same slot",
                true,
            ),
            ("CLUSTERDOWN The cluster is down", true),
            ("timed out after 1000 ms", false),
            ("Connection refused (os error 111)", false),
        ] {
            let e = StoreError::Unavailable(msg.into());
            assert_eq!(names_a_cluster(&e), cluster, "{msg}");
        }
    }
}
