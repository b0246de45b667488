//! The `fenced.v1.Cluster` calls: status, membership changes, leadership hand-off, backups
//! and alarms (what `fenced status`, `fenced member`, `fenced leader`, `fenced snapshot` and
//! `fenced alarm` send).

use std::time::Duration;

use fenced_proto::v1 as pb;
use fenced_proto::v1::cluster_client::ClusterClient;

use crate::{is_retryable, Client, ClientError, Status};

impl Client {
    /// Status of the first endpoint that answers.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.status(pb::StatusRequest {}).await }
        })
        .await
    }

    /// Add member `id` serving at `addr` as a learner; without `learner`, also promote it
    /// to voter once it has caught up (the server waits up to `wait` for that). Sent to the
    /// leader (a follower's answer names it). Returns the membership after the change.
    pub async fn member_add(
        &self,
        id: u64,
        addr: &str,
        learner: bool,
        wait: Duration,
    ) -> Result<Vec<pb::Member>, ClientError> {
        let req = pb::MemberAddRequest {
            id,
            addr: addr.to_owned(),
            learner,
            wait_ms: wait.as_millis() as u64,
        };
        self.call(wait, |ch| {
            let mut c = ClusterClient::new(ch);
            let req = req.clone();
            async move { c.member_add(req).await }
        })
        .await
        .map(|r| r.members)
    }

    /// Promote learner `id` to voter (refused until it has caught up).
    pub async fn member_promote(&self, id: u64) -> Result<Vec<pb::Member>, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.member_promote(pb::MemberPromoteRequest { id }).await }
        })
        .await
        .map(|r| r.members)
    }

    /// Ask the leader to hand leadership to a caught-up voter (`fenced leader step-down`).
    /// Requests sent meanwhile wait rather than fail.
    pub async fn leader_step_down(&self) -> Result<pb::LeaderStepDownResponse, ClientError> {
        self.call(Duration::from_secs(5), |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.leader_step_down(pb::LeaderStepDownRequest {}).await }
        })
        .await
    }

    /// A consistent backup of the cluster's state, as the pieces of a snapshot file
    /// (`fenced snapshot save`; `fenced_server::backup::save` writes and checks them). The
    /// node called answers after a linearizable read barrier.
    pub async fn snapshot_save(&self) -> Result<tonic::Streaming<pb::SnapshotChunk>, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.snapshot_save(pb::SnapshotSaveRequest {}).await }
        })
        .await
    }

    /// Remove member `id` (refused if that would leave no quorum).
    pub async fn member_remove(&self, id: u64) -> Result<Vec<pb::Member>, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.member_remove(pb::MemberRemoveRequest { id }).await }
        })
        .await
        .map(|r| r.members)
    }

    /// Status of every endpoint, in order (`Err` for the ones that did not answer).
    /// With credentials, each endpoint is logged in first: a wrong password is that
    /// endpoint's `Err(ClientError::Rejected)`.
    pub async fn status_all(&self) -> Vec<Result<Status, ClientError>> {
        let mut out = Vec::new();
        for i in 0..self.inner.channels.len() {
            let ch = match self.authed(i).await {
                Ok(ch) => ch,
                Err(s) if is_retryable(&s) => {
                    out.push(Err(ClientError::Unavailable(s.message().to_owned())));
                    continue;
                }
                Err(s) => {
                    out.push(Err(ClientError::Rejected(s)));
                    continue;
                }
            };
            let mut c = ClusterClient::new(ch);
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(2));
            out.push(
                c.status(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| ClientError::Unavailable(s.message().to_owned())),
            );
        }
        out
    }

    /// The cluster-wide `CORRUPT` alarm and the members' divergence alarms, as the first
    /// endpoint that answers knows them (`fenced alarm list`).
    pub async fn alarm_list(&self) -> Result<pb::AlarmResponse, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.alarm(pb::AlarmRequest { disarm: false }).await }
        })
        .await
    }

    /// Disarm the cluster-wide `CORRUPT` alarm (an administrator's call; `fenced alarm
    /// disarm`): the answer names the alarm cleared, if one was raised.
    pub async fn alarm_disarm(&self) -> Result<pb::AlarmResponse, ClientError> {
        self.call(Duration::ZERO, |ch| {
            let mut c = ClusterClient::new(ch);
            async move { c.alarm(pb::AlarmRequest { disarm: true }).await }
        })
        .await
    }
}
