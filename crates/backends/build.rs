//! Generates the etcd v3 client (the subset in proto/etcd.proto) with tonic-prost-build;
//! protoc comes from protoc-bin-vendored (an explicit PROTOC wins), so no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])?;
    Ok(())
}
