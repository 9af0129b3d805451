//! Replays the committed fuzz corpus (seeds and regression reproducers in `fuzz/corpus/<target>/`)
//! through the fuzz properties on stable Rust.

use std::path::Path;

#[test]
fn the_committed_fuzz_corpus_passes() {
    type Property = fn(&[u8]);
    let targets: [(&str, Property); 3] = [
        ("admission", sidecar_injector::fuzzing::admission),
        ("template", sidecar_injector::fuzzing::template),
        ("patch", sidecar_injector::fuzzing::patch),
    ];
    for (target, property) in targets {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("seed-") || name.starts_with("regression-") {
                property(&std::fs::read(&path).unwrap());
                count += 1;
            }
        }
        assert!(count >= 3, "{target}: only {count} committed inputs");
    }
}
