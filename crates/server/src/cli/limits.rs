//! `fenced serve`'s flags that bound what clients can make a node hold: queues, connections
//! and unparsed input on each port.

use anyhow::bail;
use clap::Args;
use fenced_server::NodeConfig;

#[derive(Args)]
pub struct LimitArgs {
    /// Requests that may wait for a batch on this node, per queue (proposals, proposals
    /// forwarded to the leader, linearizable reads). Past it a request is refused at once,
    /// with RESOURCE_EXHAUSTED (gRPC) or -BUSY (RESP), and nothing is done.
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_MAX_PENDING_REQUESTS)]
    max_pending_requests: usize,
    /// Connections at once on each of the gRPC and RESP ports (Redis's maxclients); past it a
    /// new connection is closed (RESP: after "-ERR max number of clients reached").
    #[arg(long, default_value_t = fenced_server::config::DEFAULT_MAX_CLIENTS)]
    max_clients: usize,
    /// Bytes of received but not yet parsed RESP input all connections together may hold
    /// (0: no cap). A read that takes the total past it closes its connection (after
    /// "-ERR Protocol error: the node's unparsed input …"), unless that connection's own
    /// unparsed input is under 16 KiB. Each connection is capped at the largest request
    /// (64 MiB); before AUTH, at Redis's 10 arguments of 16 KiB.
    #[arg(long, default_value_t = fenced_resp::DEFAULT_MAX_QUERY_BUFFER_TOTAL)]
    resp_query_buffer_total: usize,
    /// gRPC calls without a valid token (none where the node has users, or an unknown or
    /// expired one) that may be reading their request at once, all connections together
    /// (0: no limit). One past it is refused with RESOURCE_EXHAUSTED before its body is
    /// read; each such call may send at most 64 KiB, within 10 s.
    #[arg(long, default_value_t = fenced_server::pre_auth::DEFAULT_UNAUTHENTICATED_CALLS)]
    grpc_unauthenticated_calls: usize,
    /// Bytes of incomplete requests that calls with a valid token (every call, on a node
    /// without users) may hold on the client port, all together (0: no cap). A data frame
    /// that takes the total past it fails its call with RESOURCE_EXHAUSTED, unless that
    /// call's incomplete message is under 16 KiB. Each call is also capped by its method's
    /// message limit (1 MiB, etcd's 2 MiB).
    #[arg(long, default_value_t = fenced_server::request_budget::DEFAULT_REQUEST_BUFFER_TOTAL)]
    grpc_request_buffer_total: usize,
    /// HTTP/2 streams (calls in flight) per gRPC connection; a client's calls past it wait
    /// for one to end.
    #[arg(long, default_value_t = fenced_server::pre_auth::DEFAULT_MAX_CONCURRENT_STREAMS)]
    grpc_max_concurrent_streams: u32,
    /// Connections at once on the metrics port (--metrics-addr); one past it is closed at
    /// once (counted in fenced_metrics_connections_refused_total).
    #[arg(long, default_value_t = fenced_server::metrics::DEFAULT_METRICS_MAX_CONNECTIONS)]
    metrics_max_connections: usize,
}

impl LimitArgs {
    /// Set the limits of `cfg`, or say which flag is wrong.
    pub fn apply(&self, cfg: &mut NodeConfig) -> anyhow::Result<()> {
        if self.max_pending_requests == 0 || self.max_clients == 0 {
            bail!("--max-pending-requests and --max-clients must be at least 1");
        }
        if self.metrics_max_connections == 0 {
            bail!("--metrics-max-connections must be at least 1");
        }
        cfg.max_pending_requests = self.max_pending_requests;
        cfg.max_clients = self.max_clients;
        cfg.resp_query_buffer_total = self.resp_query_buffer_total;
        cfg.grpc_unauthenticated_calls = self.grpc_unauthenticated_calls;
        cfg.grpc_request_buffer_total = self.grpc_request_buffer_total;
        cfg.grpc_max_concurrent_streams = self.grpc_max_concurrent_streams.max(1);
        cfg.metrics_max_connections = self.metrics_max_connections;
        Ok(())
    }
}
