//! gRPC schemas of fenced, generated from `proto/` at build time.
//!
//! * [`v1`] — package `fenced.v1`: the client API (`Lock`, `Session`, `Cluster`).
//! * [`raft`] — package `fenced.raft.v1`: node-to-node services: the `Raft` transport
//!   (bincode-encoded openraft request/response types) and `Forward` (follower → leader).
//! * [`etcd`] — etcd's v3 API, vendored unchanged on the wire from etcd v3.5 (`proto/etcd/`):
//!   `etcdserverpb` (`KV`, `Watch`, `Lease`, `Cluster`, `Maintenance`, `Auth`), `mvccpb`,
//!   `authpb`, `v3lockpb` (`Lock`) and `v3electionpb` (`Election`).
//!
//! Both clients and servers are generated. [`FILE_DESCRIPTOR_SET`] holds the descriptors of
//! every file (a serialized `google.protobuf.FileDescriptorSet`), for reflection.

/// The `google.protobuf.FileDescriptorSet` of every `.proto` file compiled here (fenced's
/// and etcd's), as protoc wrote it: what a descriptor-driven codec such as prost-reflect
/// loads to map these messages to and from JSON.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// Client API, package `fenced.v1`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
pub mod v1 {
    tonic::include_proto!("fenced.v1");
}

/// Node-to-node Raft transport, package `fenced.raft.v1`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
pub mod raft {
    tonic::include_proto!("fenced.raft.v1");
}

/// etcd's v3 gRPC API, generated from the protos vendored in `proto/etcd/` (etcd v3.5; see its
/// README for the source revision and what was stripped). Package names are etcd's, so the
/// service paths are etcd's (`/etcdserverpb.KV/Range`, `/v3lockpb.Lock/Lock`, …) and
/// unchanged etcd clients reach a server built from them. The packages are siblings here
/// because the generated code refers across them as `super::mvccpb`, `super::etcdserverpb`.
pub mod etcd {
    /// Package `etcdserverpb`: services `KV`, `Watch`, `Lease`, `Cluster`, `Maintenance`,
    /// `Auth` and their messages.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }

    /// Package `mvccpb`: `KeyValue` and `Event`.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }

    /// Package `authpb`: `User`, `Permission`, `Role`.
    pub mod authpb {
        tonic::include_proto!("authpb");
    }

    /// Package `v3lockpb`: service `Lock`.
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }

    /// Package `v3electionpb`: service `Election`.
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}
