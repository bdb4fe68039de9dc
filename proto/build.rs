//! Generates the gRPC code from `proto/railguard.proto` with the vendored
//! protoc, so building needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/railguard.proto");
    // The order payloads an agent stores in its order log (bincode) derive
    // serde too; see `proto::agent::Order`.
    let serde = "#[derive(serde::Serialize, serde::Deserialize)]";
    let mut cfg = tonic_prost_build::configure();
    for m in [
        "StartRank",
        "RankPeer",
        "ShapeNic",
        "ShapeClass",
        "FlowMatch",
        "PaceJob",
    ] {
        cfg = cfg.type_attribute(format!("railguard.v1.{m}"), serde);
    }
    cfg.compile_protos(&["proto/railguard.proto"], &["proto"])?;
    Ok(())
}
