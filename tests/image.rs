//! The image BuildKit builds from the Dockerfile (`e2e/image/build.sh`, which the real-node suite
//! runs) must be what the Dockerfile's final stage says: binary path, user, entrypoint, command and
//! ports, on the distroless base with the C runtime the binary links. This test reads the Dockerfile
//! and the built image's amd64 entry and fails when they disagree, so neither can change alone.
//!
//! Runs when `SIDECAR_INJECTOR_IMAGE` names the OCI archive build.sh wrote (`make node-e2e` and
//! `make test` set it); without it, it says so. The Dockerfile reader's own test always runs.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
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

fn blob(layout: &Path, digest: &Value) -> Vec<u8> {
    let digest = digest.as_str().expect("a digest").trim_start_matches("sha256:");
    std::fs::read(layout.join("blobs/sha256").join(digest)).unwrap_or_else(|e| panic!("blob {digest}: {e}"))
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

#[test]
fn the_built_image_is_the_dockerfiles_final_stage() {
    let Some(archive) = std::env::var_os("SIDECAR_INJECTOR_IMAGE") else {
        println!("image: not run (set SIDECAR_INJECTOR_IMAGE to build.sh's OCI archive, or run `make node-e2e`)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stage = final_stage(&std::fs::read_to_string(root.join("Dockerfile")).unwrap());
    assert_eq!(stage.base, "gcr.io/distroless/cc-debian12:nonroot", "the base e2e/image/base-images.sh makes");

    let layout = tempfile::tempdir().unwrap();
    let status = Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(layout.path()).status().unwrap();
    assert!(status.success(), "unpacking {archive:?}");
    let layout = layout.path();
    // index.json -> the image index (a build of one platform: its manifest) -> the linux/amd64
    // manifest -> config and layers.
    let outer = json(&std::fs::read(layout.join("index.json")).unwrap());
    let top = &outer["manifests"][0];
    let manifest = if top["mediaType"] == "application/vnd.oci.image.index.v1+json" {
        let index = json(&blob(layout, &top["digest"]));
        let amd64 = index["manifests"]
            .as_array()
            .expect("the index's manifests")
            .iter()
            .find(|m| m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux")
            .unwrap_or_else(|| panic!("no linux/amd64 entry in the index: {index}"));
        json(&blob(layout, &amd64["digest"]))
    } else {
        json(&blob(layout, &top["digest"]))
    };
    let image = json(&blob(layout, &manifest["config"]["digest"]));
    assert_eq!(image["architecture"], "amd64");
    let config = &image["config"];
    assert_eq!(config["User"], stage.user.as_str(), "USER");
    let ports: BTreeSet<String> = config["ExposedPorts"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(ports, stage.ports, "EXPOSE");
    assert_eq!(config["Entrypoint"], serde_json::json!(stage.entrypoint), "ENTRYPOINT");
    assert_eq!(config["Cmd"], serde_json::json!(stage.cmd), "CMD");
    assert_eq!(stage.entrypoint.first(), Some(&stage.binary), "the entrypoint runs the copied binary");
    assert_eq!(config["WorkingDir"], "/home/nonroot", "distroless' working directory");

    // The layers, unpacked in order: the binary where the Dockerfile copies it, executable, with
    // the C runtime it links and the Dockerfile's user.
    let rootfs = tempfile::tempdir().unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let path = layout.join("blobs/sha256").join(layer["digest"].as_str().unwrap().trim_start_matches("sha256:"));
        let unpack = Command::new("tar").arg("-xf").arg(&path).arg("-C").arg(rootfs.path()).status().unwrap();
        assert!(unpack.success(), "unpacking layer {}", layer["digest"]);
    }
    let binary = rootfs.path().join(stage.binary.trim_start_matches('/'));
    let mode = std::fs::metadata(&binary).unwrap_or_else(|e| panic!("{} not in the image: {e}", stage.binary)).mode();
    assert_eq!(mode & 0o111, 0o111, "the binary is not executable by everyone: {mode:o}");
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("sidecar-injector {}", env!("CARGO_PKG_VERSION"))
    );
    let ldd = Command::new("ldd").arg(&binary).output().unwrap();
    for library in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
        // The entry itself: an absolute symbolic link in the unpacked tree would resolve on the host.
        let entry = std::fs::symlink_metadata(rootfs.path().join(library.trim_start_matches('/')));
        assert!(entry.is_ok(), "{library} (linked by the binary) not in the image");
    }
    for path in ["etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"] {
        assert!(rootfs.path().join(path).is_file(), "/{path} not in the image");
    }
    let (uid, gid) = stage.user.split_once(':').unwrap();
    let passwd = std::fs::read_to_string(rootfs.path().join("etc/passwd")).unwrap();
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
