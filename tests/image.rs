//! The image the real-node suite assembles (`e2e/node/injector-image.sh`, no registry here) must be
//! the Dockerfile's final stage: same base content, binary path, user, entrypoint, command and
//! ports. This test reads the Dockerfile and the assembled image and fails when they disagree, so
//! the two cannot drift apart.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// What the final stage of the Dockerfile says.
#[derive(Debug, Default)]
struct FinalStage {
    base: String,
    binary: String,
    user: String,
    ports: BTreeSet<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

fn final_stage(dockerfile: &str) -> FinalStage {
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let from = lines.iter().rposition(|l| l.starts_with("FROM ")).expect("a FROM line");
    let mut stage = FinalStage { base: lines[from]["FROM ".len()..].trim().to_owned(), ..Default::default() };
    for line in &lines[from + 1..] {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        let json = || serde_json::from_str::<Vec<String>>(rest).expect("exec-form JSON array");
        match instruction {
            "COPY" if rest.contains("target/release/sidecar-injector") => {
                stage.binary = rest.split_whitespace().last().unwrap().to_owned();
            }
            "USER" => stage.user = rest.to_owned(),
            "EXPOSE" => stage.ports.extend(rest.split_whitespace().map(|p| format!("{p}/tcp"))),
            "ENTRYPOINT" => stage.entrypoint = json(),
            "CMD" => stage.cmd = json(),
            _ => {}
        }
    }
    stage
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(layout.join("blobs/sha256").join(digest.trim_start_matches("sha256:"))).unwrap()
}

#[test]
fn the_assembled_image_is_the_dockerfiles_final_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stage = final_stage(&std::fs::read_to_string(root.join("Dockerfile")).unwrap());
    // The assembler rebuilds this base from the host's Debian 12 files; another base needs it changed.
    assert_eq!(
        stage.base, "gcr.io/distroless/cc-debian12:nonroot",
        "update e2e/node/injector-image.sh for the new base"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("image.tar");
    let status = Command::new("bash")
        .arg(root.join("e2e/node/injector-image.sh"))
        .arg(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("localhost/test/sidecar-injector:test")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "injector-image.sh failed");
    let layout = dir.path().join("image.tar.d");
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(entry["annotations"]["io.containerd.image.name"], "localhost/test/sidecar-injector:test");
    let manifest: Value = serde_json::from_slice(&blob(&layout, entry["digest"].as_str().unwrap())).unwrap();
    let image: Value = serde_json::from_slice(&blob(&layout, manifest["config"]["digest"].as_str().unwrap())).unwrap();
    let config = &image["config"];

    assert_eq!(config["User"], stage.user.as_str(), "USER");
    let ports: BTreeSet<String> = config["ExposedPorts"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(ports, stage.ports, "EXPOSE");
    assert_eq!(config["Entrypoint"], serde_json::json!(stage.entrypoint), "ENTRYPOINT");
    assert_eq!(config["Cmd"], serde_json::json!(stage.cmd), "CMD");
    assert_eq!(stage.entrypoint.first(), Some(&stage.binary), "the entrypoint runs the copied binary");

    // The layer holds the binary where the Dockerfile copies it, with the C runtime it links.
    let layer = layout
        .join("blobs/sha256")
        .join(manifest["layers"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    let listing = Command::new("tar").arg("-tvf").arg(&layer).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    let entry_for = |path: &str| listing.lines().find(|l| l.ends_with(&format!(" .{path}"))).map(str::to_owned);
    let binary = entry_for(&stage.binary).unwrap_or_else(|| panic!("{} not in the image:\n{listing}", stage.binary));
    assert!(binary.starts_with("-rwx"), "the binary is not executable: {binary}");
    for path in ["/etc/passwd", "/etc/group", "/etc/ssl/certs/ca-certificates.crt"] {
        assert!(entry_for(path).is_some(), "{path} not in the image");
    }
    let ldd = Command::new("ldd").arg(env!("CARGO_BIN_EXE_sidecar-injector")).output().unwrap();
    for library in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
        assert!(entry_for(library).is_some(), "{library} (linked by the binary) not in the image");
    }
    // The Dockerfile's user exists in the image, as distroless' nonroot does.
    let (uid, gid) = stage.user.split_once(':').unwrap();
    let passwd = Command::new("tar").arg("-xOf").arg(&layer).arg("./etc/passwd").output().unwrap();
    let passwd = String::from_utf8_lossy(&passwd.stdout);
    assert!(
        passwd.lines().any(|l| l.starts_with(&format!("nonroot:x:{uid}:{gid}:"))),
        "no nonroot {uid}:{gid} in /etc/passwd:\n{passwd}"
    );
}

#[test]
fn the_dockerfile_reader_finds_what_drift_would_change() {
    let stage = final_stage(
        "FROM rust AS build\nUSER 1\nFROM base:tag\nCOPY --from=build /src/target/release/sidecar-injector /bin/x\nUSER 1:2\nEXPOSE 1 2\nENTRYPOINT [\"/bin/x\"]\nCMD [\"serve\", \"-v\"]\n",
    );
    assert_eq!(stage.base, "base:tag");
    assert_eq!(stage.binary, "/bin/x");
    assert_eq!(stage.user, "1:2");
    assert_eq!(stage.ports, BTreeSet::from(["1/tcp".to_owned(), "2/tcp".to_owned()]));
    assert_eq!(stage.entrypoint, vec!["/bin/x"]);
    assert_eq!(stage.cmd, vec!["serve", "-v"]);
}
