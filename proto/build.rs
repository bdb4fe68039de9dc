//! Generates the gRPC code from `proto/railguard.proto` with the vendored
//! protoc, so building needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/railguard.proto");
    tonic_prost_build::configure().compile_protos(&["proto/railguard.proto"], &["proto"])?;
    Ok(())
}
