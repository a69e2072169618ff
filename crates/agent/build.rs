//! Builds the agent's glue to OpenPMIx's server library (src/step/pmix/shim.c) against the
//! installed headers and links libpmix (Debian `libpmix-dev`, installed by scripts/setup.sh).

fn main() {
    println!("cargo:rerun-if-changed=src/step/pmix/shim.c");
    // Only the include paths: pmix.pc's -L names a directory holding just the static
    // libpmix.a (Debian), while the agent links the shared libpmix.so from the default path.
    let pmix = pkg_config::Config::new().cargo_metadata(false).env_metadata(false).probe("pmix");
    let includes = match pmix {
        Ok(lib) => lib.include_paths,
        Err(e) => {
            let fallback = std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu/pmix2/include");
            if !fallback.join("pmix_server.h").exists() {
                panic!("OpenPMIx's headers were not found ({e}): install libpmix-dev (bash scripts/setup.sh)");
            }
            vec![fallback]
        }
    };
    let mut cc = cc::Build::new();
    cc.file("src/step/pmix/shim.c").warnings(true).extra_warnings(true).flag_if_supported("-Wno-unused-parameter");
    for i in &includes {
        cc.include(i);
    }
    cc.compile("berth_pmix_shim");
    println!("cargo:rustc-link-lib=dylib=pmix");
}
