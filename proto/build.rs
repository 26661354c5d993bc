//! Compiles the `.proto` files with the vendored protoc, so `cargo build` needs nothing else.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // The rpc `Connect` would collide with the generated `connect` constructor: clients build a
    // Channel themselves and call `new`.
    tonic_prost_build::configure()
        .build_transport(false)
        .file_descriptor_set_path(out_dir.join("nexus_descriptor.bin"))
        .compile_with_config(
            config,
            &["proto/nexus/runner/v1/runner.proto", "proto/nexus/agent/v1/agent.proto"],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
