//! Smoke test of the etcd-API load generator's code paths (`fenced-bench --kv`) against a tiny
//! in-process etcd stand-in (a map behind KV Put/Range/Txn and a Watch that fans every put out
//! to every watch): each workload runs briefly, counts operations and no errors, and the
//! tables render. Not a benchmark: a fraction of a second.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_backends::etcd::{mvccpb, pb};
use fenced_bench::kv::KvOp;
use fenced_bench::kvbench::{run, KvConfig, Target};
use fenced_bench::memory::MemoryWorkload;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// key → (value, mod revision), and the revision counter.
type State = (BTreeMap<Vec<u8>, (Vec<u8>, i64)>, i64);

#[derive(Clone)]
struct Fake {
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<mvccpb::KeyValue>,
}

impl Fake {
    fn header(rev: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            revision: rev,
            ..Default::default()
        })
    }

    fn get(&self, key: &[u8]) -> (Vec<mvccpb::KeyValue>, i64) {
        let s = self.state.lock().expect("state");
        let kvs =
            s.0.get(key)
                .map(|(v, r)| mvccpb::KeyValue {
                    key: key.to_vec(),
                    value: v.clone(),
                    mod_revision: *r,
                    ..Default::default()
                })
                .into_iter()
                .collect();
        (kvs, s.1)
    }

    fn put_all(&self, puts: Vec<pb::PutRequest>) -> i64 {
        let mut s = self.state.lock().expect("state");
        s.1 += 1;
        let rev = s.1;
        for p in puts {
            s.0.insert(p.key.clone(), (p.value.clone(), rev));
            let _ = self.events.send(mvccpb::KeyValue {
                key: p.key,
                value: p.value,
                mod_revision: rev,
                ..Default::default()
            });
        }
        rev
    }
}

#[tonic::async_trait]
impl pb::kv_server::Kv for Fake {
    async fn range(
        &self,
        r: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let (kvs, rev) = self.get(&r.into_inner().key);
        Ok(Response::new(pb::RangeResponse {
            header: Self::header(rev),
            count: kvs.len() as i64,
            kvs,
            ..Default::default()
        }))
    }

    async fn put(&self, r: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let rev = self.put_all(vec![r.into_inner()]);
        Ok(Response::new(pb::PutResponse {
            header: Self::header(rev),
            prev_kv: None,
        }))
    }

    async fn delete_range(
        &self,
        _: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn txn(&self, r: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let t = r.into_inner();
        // Only what the load generator sends: mod-revision compares, puts, point ranges.
        let ok = t.compare.iter().all(|c| {
            let (kvs, _) = self.get(&c.key);
            let have = kvs.first().map_or(0, |kv| kv.mod_revision);
            c.target_union == Some(pb::compare::TargetUnion::ModRevision(have))
        });
        let ops = if ok { t.success } else { t.failure };
        let mut puts = Vec::new();
        let mut responses = Vec::new();
        for op in ops {
            match op.request {
                Some(pb::request_op::Request::RequestPut(p)) => puts.push(p),
                Some(pb::request_op::Request::RequestRange(rr)) => {
                    let (kvs, _) = self.get(&rr.key);
                    responses.push(pb::ResponseOp {
                        response: Some(pb::response_op::Response::ResponseRange(
                            pb::RangeResponse {
                                kvs,
                                ..Default::default()
                            },
                        )),
                    });
                }
                _ => return Err(Status::unimplemented("fake")),
            }
        }
        let rev = if puts.is_empty() {
            self.get(b"").1
        } else {
            self.put_all(puts)
        };
        Ok(Response::new(pb::TxnResponse {
            header: Self::header(rev),
            succeeded: ok,
            responses,
        }))
    }

    async fn compact(
        &self,
        _: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::watch_server::Watch for Fake {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        r: Request<tonic::Streaming<pb::WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let mut inbound = r.into_inner();
        let mut events = self.events.subscribe();
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut watches: Vec<(i64, Vec<u8>)> = Vec::new();
            loop {
                tokio::select! {
                    req = inbound.next() => {
                        let Some(Ok(req)) = req else { return };
                        if let Some(pb::watch_request::RequestUnion::CreateRequest(c)) =
                            req.request_union
                        {
                            let id = watches.len() as i64;
                            watches.push((id, c.key));
                            let created = pb::WatchResponse {
                                watch_id: id,
                                created: true,
                                ..Default::default()
                            };
                            if tx.send(Ok(created)).await.is_err() {
                                return;
                            }
                        }
                    }
                    ev = events.recv() => {
                        let Ok(kv) = ev else { return };
                        for (id, prefix) in &watches {
                            if kv.key.starts_with(prefix) {
                                let r = pb::WatchResponse {
                                    watch_id: *id,
                                    events: vec![mvccpb::Event {
                                        kv: Some(kv.clone()),
                                        ..Default::default()
                                    }],
                                    ..Default::default()
                                };
                                if tx.send(Ok(r)).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_against_an_etcd_stand_in() {
    let fake = Fake {
        state: Arc::new(Mutex::new((BTreeMap::new(), 1))),
        events: broadcast::channel(65_536).0,
    };
    let incoming =
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
    let addr = incoming.local_addr().expect("local addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::kv_server::KvServer::new(fake.clone()))
            .add_service(pb::watch_server::WatchServer::new(fake))
            .serve_with_incoming(incoming),
    );
    let cfg = KvConfig {
        targets: vec![Target {
            name: "fake".into(),
            endpoints: vec![addr.to_string()],
            pids: Some(vec![std::process::id().to_string()]),
        }],
        ops: vec![KvOp::Put, KvOp::Txn, KvOp::Range, KvOp::Mixed],
        watch: true,
        clients: vec![2],
        duration: Duration::from_millis(150),
        rounds: 1,
        value_size: 100,
        keyspace: 250,
        put_percent: 30,
        watchers: 10,
        watch_streams: 3,
        watch_rates: vec![200.0],
        watch_writers: 2,
        memory: Some(MemoryWorkload {
            keys: 1000,
            value_size: 100,
            rate: 500.0,
            seconds: 0.2,
            clients: 4,
            prefix: String::new(),
        }),
        run_id: "smoke".into(),
    };
    let report = run(&cfg).await.expect("run");
    let rows = report.json.as_array().expect("rows");
    assert_eq!(rows.len(), 6, "{:#}", report.json);
    for row in rows {
        assert_eq!(row["errors"], 0, "{row:#}");
    }
    for row in &rows[..4] {
        assert!(row["ops"].as_u64().is_some_and(|n| n > 0), "{row:#}");
        assert_eq!(row["cas_failed"], 0, "{row:#}");
    }
    let watch = &rows[4];
    assert!(watch["puts"].as_u64().is_some_and(|n| n > 0), "{watch:#}");
    assert_eq!(watch["missing"], 0, "{watch:#}");
    let memory = &rows[5];
    assert!(
        memory["rss_after_history"][0]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{memory:#}"
    );
    for table in [
        "| txn-cas | 2 | fake |",
        "| mixed 30/70 | 2 | fake |",
        "10 watchers / 3 streams, 2 writers at 200 puts/s",
        "| 1000 keys × 100 B | fake |",
    ] {
        assert!(
            report.markdown.contains(table),
            "{table} in\n{}",
            report.markdown
        );
    }
}
