//! The rollup task: every interval, take the counts, route each account to
//! its master on the ring, send one request per master (split when large),
//! apply the factors in the replies, and carry over what could not be sent.
//!
//! Intervals are cut on the wall-clock grid (multiples of the rollup
//! interval since the epoch), the same for every agent, so a master can tell
//! which reports belong to one round. Sends are spread over the first fifth
//! of the interval by agent id, so masters do not see every agent at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use damper_core::agent::{AgentState, Pending, agent_seed, send_spread};
use damper_core::membership::{HealthConfig, Membership};
use damper_core::ring::Ring;
use damper_core::time::{Clock, Nanos, SystemClock};
use damper_proto::v1::master_client::MasterClient;
use damper_proto::v1::{
    AccountCounts, FactorsRequest, OpAccounts, OpCounts, RollupReply, RollupRequest,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::{Masters, Shared};

pub(crate) struct Settings {
    pub(crate) masters: Masters,
    pub(crate) rollup_interval: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) max_entries_per_request: usize,
    pub(crate) max_carry: Duration,
    pub(crate) tls: Option<crate::AgentTls>,
    pub(crate) health: HealthConfig,
}

/// One request to one master, with what it carries.
struct Batch {
    master: String,
    request: RollupRequest,
    pending: Vec<Pending>,
}

pub(crate) async fn run(shared: Arc<Shared>, settings: Settings, mut stop: watch::Receiver<bool>) {
    let interval = settings.rollup_interval;
    let seed = agent_seed(&shared.agent_id);
    let mut members = Members::new(&settings.masters, settings.health, seed).await;
    let mut clients = Clients::new(settings.request_timeout, settings.tls.clone());
    let spread = send_spread(&shared.agent_id, interval);
    let mut start = grid_floor(SystemClock.now(), interval);
    // Factor rechecks a master asked for, in flight.
    let mut rechecks = JoinSet::new();
    tracing::info!(agent = %shared.agent_id, masters = ?members.membership.members().collect::<Vec<_>>(), "damper agent started");
    loop {
        let boundary = start + interval;
        let stopping = *stop.borrow()
            || tokio::select! {
                () = tokio::time::sleep(boundary.since(SystemClock.now())) => false,
                _ = stop.changed() => true,
            };
        let end = if stopping {
            SystemClock.now().max(start)
        } else {
            boundary
        };
        members.membership.tick(SystemClock.now());
        let (batches, unroutable_bytes) =
            drain(&shared, members.membership.live(), start, end, &settings);
        let mut probing = JoinSet::new();
        for master in members.membership.probes_due(SystemClock.now()) {
            if let Ok(client) = clients.get(&master) {
                probing.spawn(probe(client, shared.agent_id.clone(), master));
            }
        }
        if !stopping && !spread.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(spread) => {}
                _ = stop.changed() => {}
            }
        }
        let (asked, outcomes, foreign, failed_bytes) =
            send(&shared, &mut clients, batches, start, end, &settings).await;
        // What this agent holds undelivered, as the requests that would
        // carry it: those that failed and those with no master to go to.
        metrics::gauge!("damper_agent_pending_bytes").set((failed_bytes + unroutable_bytes) as f64);
        if foreign {
            // Probe the masters this agent has down within the interval: the
            // others see one of them up.
            let hastened = members
                .membership
                .hasten_probes(SystemClock.now(), interval);
            if hastened > 0 {
                tracing::info!(
                    hastened,
                    "a master reports a different ring: probing down masters now"
                );
            }
        }
        for (master, ok) in outcomes {
            let m = &mut members.membership;
            let changed = if ok {
                m.succeeded(&master, SystemClock.now())
            } else {
                m.failed(&master, SystemClock.now())
            };
            if changed {
                tracing::warn!(%master, up = ok, live = ?m.live().members().collect::<Vec<_>>(), "master ring changed");
            }
        }
        while let Some(joined) = probing.join_next().await {
            let Ok((master, started)) = joined else {
                continue;
            };
            let m = &mut members.membership;
            match started {
                Some(started) => {
                    m.answered(&master, Some(started), SystemClock.now());
                    if !m.is_up(&master) {
                        tracing::info!(%master, "master answers again; rejoining after its warm-up");
                    }
                }
                None => {
                    m.failed(&master, SystemClock.now());
                }
            }
        }
        let lapsed = shared.state.expired_factors(shared.clock.now());
        if lapsed > 0 {
            shared
                .stats
                .factors_expired
                .fetch_add(lapsed as u64, Relaxed);
            metrics::counter!("damper_agent_factors_expired_total").increment(lapsed as u64);
            tracing::warn!(
                lapsed,
                "factors lapsed with no fresh one from their master: those (account, op) pairs fail open"
            );
        }
        let forgotten = shared.state.forget_idle(shared.clock.now());
        shared.stats.forgotten.fetch_add(forgotten as u64, Relaxed);
        metrics::counter!("damper_agent_forgotten_total").increment(forgotten as u64);
        metrics::gauge!("damper_agent_pairs").set(shared.state.len() as f64);
        while rechecks.try_join_next().is_some() {}
        for (master, after, keys) in asked {
            if let Ok(client) = clients.get(&master) {
                rechecks.spawn(recheck(
                    shared.clone(),
                    client,
                    master,
                    after,
                    keys,
                    settings.rollup_interval,
                ));
            }
        }
        start = end;
        if stopping {
            rechecks.abort_all();
            tracing::info!(agent = %shared.agent_id, "damper agent stopped after a last rollup");
            return;
        }
        if members.refresh_if_due().await {
            clients.retain(members.membership.members());
        }
    }
}

/// The start of the grid interval that contains `now`.
fn grid_floor(now: Nanos, interval: Duration) -> Nanos {
    let i = u64::try_from(interval.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    Nanos::from_nanos(now.as_nanos() / i * i)
}

/// Takes every (account, op)'s counts, routed by the ring, and groups them
/// into requests of at most `max_entries`, one or more per master. Also
/// returns the encoded size of the counts no master could take (carried
/// over).
fn drain(
    shared: &Shared,
    ring: &Ring,
    start: Nanos,
    end: Nanos,
    settings: &Settings,
) -> (Vec<Batch>, usize) {
    let max_entries = settings.max_entries_per_request;
    let routed = shared.state.drain_by_owner(ring);
    let mut unroutable_bytes = 0;
    if !routed.unroutable.is_empty() {
        unroutable_bytes = prost::Message::encoded_len(&rollup_request(
            &shared.agent_id,
            start,
            end,
            &routed.unroutable,
        ));
        tracing::warn!(
            entries = routed.unroutable.len(),
            "no master to send counts to; carrying them over"
        );
        for p in routed.unroutable {
            carry_over(shared, p, start, end, settings.max_carry);
        }
    }
    let mut batches = Vec::new();
    for (master, mut pending) in routed.by_master {
        while !pending.is_empty() {
            let rest = pending.split_off(pending.len().min(max_entries));
            let chunk = std::mem::replace(&mut pending, rest);
            batches.push(Batch {
                master: master.clone(),
                request: RollupRequest {
                    ring_version: ring.version(),
                    ..rollup_request(&shared.agent_id, start, end, &chunk)
                },
                pending: chunk,
            });
        }
    }
    (batches, unroutable_bytes)
}

/// The request that reports `pending` (a drain's counts for one master,
/// sorted by op) for the interval `[start, end)`: counts grouped by op, each
/// with its own start when it was carried over.
pub fn rollup_request(
    agent_id: &str,
    start: Nanos,
    end: Nanos,
    pending: &[Pending],
) -> RollupRequest {
    let counts = pending.iter().map(|p| {
        let counts = AccountCounts {
            account: p.account.clone(),
            attempted: p.delta.attempted,
            admitted: p.delta.admitted,
            start_unix_ms: p.delta.since.map_or(0, Nanos::as_millis),
        };
        (p.op.clone(), counts)
    });
    RollupRequest {
        agent_id: agent_id.to_owned(),
        interval_start_unix_ms: start.as_millis(),
        interval_end_unix_ms: end.as_millis(),
        ops: group_by_op(counts)
            .into_iter()
            .map(|(op, accounts)| OpCounts { op, accounts })
            .collect(),
        ring_version: 0,
    }
}

/// Groups `(op, item)` pairs that come sorted by op: one entry per op, so
/// each op name goes on the wire once.
fn group_by_op<T>(items: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    for (op, item) in items {
        match groups.last_mut() {
            Some((last, group)) if *last == op => group.push(item),
            _ => groups.push((op, vec![item])),
        }
    }
    groups
}

/// Puts back counts that could not be delivered, counting what is dropped
/// for being older than `max_carry`.
fn carry_over(shared: &Shared, p: Pending, start: Nanos, end: Nanos, max_carry: Duration) {
    let dropped = shared.state.carry_over(p, start, end, max_carry);
    if dropped > 0 {
        shared.stats.dropped_cost.fetch_add(dropped, Relaxed);
        metrics::counter!("damper_agent_rollup_dropped_cost_total").increment(dropped);
    }
}

/// A recheck a master asked for: its address, how long to wait, and the
/// (op, account) pairs it marked.
type Asked = (String, Duration, Vec<(String, String)>);

/// Sends every batch concurrently, applies the replies, carries over the
/// counts of the failures. Returns the rechecks the masters asked for, each
/// master's outcome, whether any said the ring differs, and the encoded size
/// of the requests that failed.
async fn send(
    shared: &Arc<Shared>,
    clients: &mut Clients,
    batches: Vec<Batch>,
    start: Nanos,
    end: Nanos,
    settings: &Settings,
) -> (Vec<Asked>, BTreeMap<String, bool>, bool, usize) {
    let mut asked = Vec::new();
    // Did a master say this agent's ring differs from its own?
    let mut foreign = false;
    // Per master: did every request to it succeed?
    let mut outcomes: BTreeMap<String, bool> = BTreeMap::new();
    // Encoded size of the requests that failed: counts waiting to be resent.
    let mut pending_bytes = 0usize;
    let mut in_flight = JoinSet::new();
    for batch in batches {
        let bytes = prost::Message::encoded_len(&batch.request);
        let client = match clients.get(&batch.master) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(master = %batch.master, error = %e, "bad master address");
                pending_bytes += bytes;
                for p in batch.pending {
                    carry_over(shared, p, start, end, settings.max_carry);
                }
                continue;
            }
        };
        in_flight.spawn(async move {
            let mut client = client;
            let began = tokio::time::Instant::now();
            let result = client.rollup(batch.request).await;
            (batch.master, batch.pending, result, began.elapsed(), bytes)
        });
    }
    while let Some(joined) = in_flight.join_next().await {
        let Ok((master, pending, result, took, bytes)) = joined else {
            continue; // A send task panicked: its counts are lost, nothing else.
        };
        metrics::histogram!("damper_agent_rollup_duration_seconds").record(took.as_secs_f64());
        match result {
            Ok(reply) => {
                metrics::counter!("damper_agent_rollups_total", "result" => "ok").increment(1);
                outcomes.entry(master.clone()).or_insert(true);
                count_delivered(&pending);
                let reply = reply.into_inner();
                shared.stats.answered(
                    pending.len(),
                    bytes,
                    prost::Message::encoded_len(&reply),
                    took,
                );
                if reply.foreign_entries > 0 {
                    foreign = true;
                    tracing::debug!(%master, entries = reply.foreign_entries, "the master does not own some accounts sent to it: this agent's ring differs");
                }
                if reply.recheck_after_ms > 0 {
                    let keys: Vec<(String, String)> = reply
                        .ops
                        .iter()
                        .flat_map(|op| {
                            op.accounts
                                .iter()
                                .filter(|f| f.recheck)
                                .map(|f| (op.op.clone(), f.account.clone()))
                        })
                        .collect();
                    let after = Duration::from_millis(u64::from(reply.recheck_after_ms));
                    asked.push((master.clone(), after, keys));
                }
                let asked = pending.iter().map(|p| (p.op.as_str(), p.account.as_str()));
                apply(shared, &master, &reply, asked, settings.rollup_interval);
            }
            Err(status) => {
                metrics::counter!("damper_agent_rollups_total", "result" => "error").increment(1);
                shared.stats.rollups_failed.fetch_add(1, Relaxed);
                outcomes.insert(master.clone(), false);
                pending_bytes += bytes;
                tracing::warn!(%master, code = ?status.code(), message = status.message(), "rollup failed; carrying counts over");
                for p in pending {
                    carry_over(shared, p, start, end, settings.max_carry);
                }
            }
        }
    }
    (asked, outcomes, foreign, pending_bytes)
}

/// Counts the cost admitted and rejected per op once a master has it:
/// `damper_agent_admitted_cost_total{op}` and
/// `damper_agent_rejected_cost_total{op}`. Counted here, off `check`'s path,
/// where each count is delivered exactly once (carried-over counts when
/// they finally go). `pending` comes sorted by op.
fn count_delivered(pending: &[Pending]) {
    for group in pending.chunk_by(|a, b| a.op == b.op) {
        let (admitted, attempted) = group.iter().fold((0u64, 0u64), |(ad, at), p| {
            (
                ad.saturating_add(p.delta.admitted),
                at.saturating_add(p.delta.attempted),
            )
        });
        let op = group[0].op.clone();
        metrics::counter!("damper_agent_admitted_cost_total", "op" => op.clone())
            .increment(admitted);
        metrics::counter!("damper_agent_rejected_cost_total", "op" => op)
            .increment(attempted.saturating_sub(admitted));
    }
}

/// Waits `after`, then asks `master` for the factors of `keys` and applies
/// them: the round this agent reported early in is whole by then.
async fn recheck(
    shared: Arc<Shared>,
    mut client: MasterClient<Channel>,
    master: String,
    after: Duration,
    keys: Vec<(String, String)>,
    interval: Duration,
) {
    tokio::time::sleep(after).await;
    let request = FactorsRequest {
        agent_id: shared.agent_id.clone(),
        ops: group_by_op(keys.iter().cloned())
            .into_iter()
            .map(|(op, accounts)| OpAccounts { op, accounts })
            .collect(),
    };
    match client.factors(request).await {
        Ok(reply) => {
            metrics::counter!("damper_agent_rechecks_total", "result" => "ok").increment(1);
            let asked = keys
                .iter()
                .map(|(op, account)| (op.as_str(), account.as_str()));
            apply(&shared, &master, &reply.into_inner(), asked, interval);
        }
        Err(status) => {
            // The factor in force stays until the next rollup's reply.
            metrics::counter!("damper_agent_rechecks_total", "result" => "error").increment(1);
            tracing::debug!(%master, code = ?status.code(), "factor recheck failed");
        }
    }
}

fn apply<'a>(
    shared: &Shared,
    master: &str,
    reply: &RollupReply,
    asked: impl IntoIterator<Item = (&'a str, &'a str)>,
    interval: Duration,
) {
    if reply.rollup_interval_ms != 0 && u128::from(reply.rollup_interval_ms) != interval.as_millis()
    {
        tracing::warn!(%master, master_ms = reply.rollup_interval_ms, agent_ms = interval.as_millis() as u64,
            "rollup interval differs from the master's: rounds will not line up");
    }
    apply_reply(&shared.state, shared.clock.now(), reply, asked);
}

/// Applies a master's reply at `now` to the pairs it answers: the factors it
/// lists, and factor 0 under their op's `unlisted_limit` for the pairs in
/// `asked` (`(op, account)`: those the request named) that it does not list.
pub fn apply_reply<'a>(
    state: &AgentState,
    now: Nanos,
    reply: &RollupReply,
    asked: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    // Per op with a verdict for its unlisted accounts: that verdict, and
    // the accounts listed (few: the suppressed and the specially limited).
    let mut unlisted: HashMap<&str, (f64, Duration, HashSet<&str>)> = HashMap::new();
    for op in &reply.ops {
        for f in &op.accounts {
            let valid_for = Duration::from_millis(u64::from(f.valid_for_ms));
            state.apply(now, &f.account, &op.op, f.factor, f.limit, valid_for);
        }
        if op.unlisted_limit > 0.0 {
            let valid_for = Duration::from_millis(u64::from(op.unlisted_valid_for_ms));
            let listed = op.accounts.iter().map(|f| f.account.as_str()).collect();
            unlisted.insert(op.op.as_str(), (op.unlisted_limit, valid_for, listed));
        }
    }
    if unlisted.is_empty() {
        return;
    }
    for (op, account) in asked {
        if let Some((limit, valid_for, listed)) = unlisted.get(op) {
            if !listed.contains(account) {
                state.apply(now, account, op, 0.0, *limit, *valid_for);
            }
        }
    }
}

/// The configured masters and their health ([`Membership`]).
struct Members {
    membership: Membership,
    dns: Option<Dns>,
}

struct Dns {
    host: String,
    port: u16,
    every: Duration,
    next: tokio::time::Instant,
}

impl Members {
    async fn new(masters: &Masters, health: HealthConfig, seed: u64) -> Members {
        match masters {
            Masters::Static(list) => Members {
                membership: Membership::new(list, health, seed),
                dns: None,
            },
            Masters::Dns { host, port, every } => {
                let mut members = Members {
                    membership: Membership::new(Vec::<String>::new(), health, seed),
                    dns: Some(Dns {
                        host: host.clone(),
                        port: *port,
                        every: *every,
                        next: tokio::time::Instant::now(),
                    }),
                };
                members.refresh_if_due().await;
                members
            }
        }
    }

    /// Resolves the DNS name again when due. Returns whether the ring changed.
    async fn refresh_if_due(&mut self) -> bool {
        let Some(dns) = &mut self.dns else {
            return false;
        };
        if tokio::time::Instant::now() < dns.next {
            return false;
        }
        dns.next = tokio::time::Instant::now() + dns.every;
        let target = format!("{}:{}", dns.host, dns.port);
        let resolved = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host(target.clone()),
        )
        .await;
        let addresses: Vec<String> = match resolved {
            Ok(Ok(addrs)) => addrs.map(|a| a.to_string()).collect(),
            Ok(Err(e)) => {
                tracing::warn!(%target, error = %e, "cannot resolve masters; keeping the last list");
                return false;
            }
            Err(_) => {
                tracing::warn!(%target, "resolving masters timed out; keeping the last list");
                return false;
            }
        };
        let changed = self.membership.set_members(&addresses);
        if changed {
            tracing::info!(%target, masters = ?addresses, "master list changed");
        }
        changed
    }
}

/// Asks a down master whether it answers again: a `Factors` call naming
/// nothing. Returns when it started, if it answered.
async fn probe(
    mut client: MasterClient<Channel>,
    agent_id: String,
    master: String,
) -> (String, Option<Nanos>) {
    let request = FactorsRequest {
        agent_id,
        ops: Vec::new(),
    };
    match client.factors(request).await {
        Ok(reply) => (
            master,
            Some(Nanos::from_millis(reply.into_inner().started_unix_ms)),
        ),
        Err(_) => (master, None),
    }
}

/// One lazily connected gRPC client per master.
struct Clients {
    timeout: Duration,
    tls: Option<tonic::transport::ClientTlsConfig>,
    by_master: HashMap<String, MasterClient<Channel>>,
}

impl Clients {
    fn new(timeout: Duration, tls: Option<crate::AgentTls>) -> Clients {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let tls = tls.map(|t| {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&t.ca_pem));
            if let Some((cert, key)) = &t.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            match t.domain {
                Some(domain) => config.domain_name(domain),
                None => config,
            }
        });
        Clients {
            timeout,
            tls,
            by_master: HashMap::new(),
        }
    }

    fn get(&mut self, master: &str) -> Result<MasterClient<Channel>, tonic::transport::Error> {
        if let Some(client) = self.by_master.get(master) {
            return Ok(client.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{master}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        let client = MasterClient::new(channel);
        self.by_master.insert(master.to_owned(), client.clone());
        Ok(client)
    }

    /// Drops the clients of masters no longer configured.
    fn retain<'a>(&mut self, members: impl Iterator<Item = &'a str>) {
        let members: Vec<&str> = members.collect();
        self.by_master.retain(|m, _| members.contains(&m.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_cut_on_a_shared_grid() {
        let two = Duration::from_secs(2);
        assert_eq!(
            grid_floor(Nanos::from_millis(1_800_000_001_999), two),
            Nanos::from_millis(1_800_000_000_000)
        );
        assert_eq!(
            grid_floor(Nanos::from_millis(1_800_000_002_000), two),
            Nanos::from_millis(1_800_000_002_000)
        );
    }
}
