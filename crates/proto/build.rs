//! Compiles every `.proto` file under the workspace's `proto/` directory with
//! tonic-prost-build (messages, clients and servers). `protoc` comes from
//! `protoc-bin-vendored`, so no system protoc is needed (an explicit `PROTOC` wins).

use std::path::{Path, PathBuf};

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // Build scripts are single-threaded here; tonic-prost-build reads PROTOC below.
        std::env::set_var("PROTOC", protoc);
    }

    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let mut protos = Vec::new();
    collect_protos(&proto_root, &mut protos)?;
    protos.sort();
    // A directory makes cargo rerun when anything below it changes (including new files).
    println!("cargo:rerun-if-changed={}", proto_root.display());
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    // The descriptors of every file compiled, for descriptor-driven codecs (the server's
    // etcd JSON gateway maps JSON to these messages with prost-reflect).
    let descriptors = PathBuf::from(std::env::var("OUT_DIR")?).join("file_descriptor_set.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .build_client(true)
        .build_server(true)
        .compile_protos(&protos, &[proto_root])?;
    Ok(())
}
